package relay

// The DBOS release this client was built for. A release outside it may have moved or renamed a call this client
// makes (v1.7 moved the conductor client out, v1.9 exported the recovery call), and would fail later, at a worse
// moment: Connect refuses it, in one line.

import (
	"fmt"
	"regexp"
	"runtime/debug"
	"strconv"
)

// Version is this client's version.
const Version = "0.1.0"

// SDKModule is the DBOS Transact module this client works with.
const SDKModule = "github.com/dbos-inc/dbos-transact-golang"

// SupportedSDK is the range of SDKModule releases this client supports.
const SupportedSDK = "v1.9.x"

// A release, not a pre-release (v1.9.1-rc.1) or a pseudo-version: their calls are not the release's.
var supported = regexp.MustCompile(`^v1\.9\.(0|[1-9][0-9]*)$`)

// CheckSDKVersion is nil when found (the SDK's version, "" when none) is in SupportedSDK, else an error in one line.
func CheckSDKVersion(found string) error {
	if supported.MatchString(found) {
		return nil
	}
	shown := "no version of it"
	if found != "" {
		shown = strconv.Quote(found)
		if shown == `"`+found+`"` {
			shown = found
		}
	}
	return fmt.Errorf("relay-dbos-go %s supports %s %s; this program has %s", Version, SDKModule, SupportedSDK, shown)
}

// SDKVersion is the version of SDKModule built into this program, from its build information: the replacement's
// version when go.mod replaces it, "" when it is not there (or replaced by a directory, whose code is anyone's).
func SDKVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return sdkVersionIn(info)
}

// sdkVersionIn is the version of SDKModule in a program's build information. (A test binary's has no modules in
// it: there the answer is "".)
func sdkVersionIn(info *debug.BuildInfo) string {
	for _, dep := range info.Deps {
		if dep.Path == SDKModule {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return ""
}

// sdkVersion is SDKVersion, a variable so the tests can play another build.
var sdkVersion = SDKVersion
