package relay

// The SDK version check: v1.9.x releases are accepted, anything else refused, in one line.

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestSupportedReleasesAreAccepted(t *testing.T) {
	for _, found := range []string{"v1.9.0", "v1.9.1", "v1.9.12"} {
		if err := CheckSDKVersion(found); err != nil {
			t.Errorf("%s: %v", found, err)
		}
	}
}

func TestOtherVersionsAreRefusedInOneLine(t *testing.T) {
	for _, found := range []string{"v1.8.0", "v1.6.0", "v1.10.0", "v2.9.0", "v1.9.0-rc.1", "v1.9.1-0.20261201000000-abcdefabcdef",
		"v1.9.0+incompatible", "1.9.0", "v1.9", "v1.9.01", "(devel)", "", " v1.9.0", "v1.9.0\n", "garbage"} {
		err := CheckSDKVersion(found)
		if err == nil {
			t.Errorf("%q accepted", found)
			continue
		}
		prefix := "relay-dbos-go " + Version + " supports github.com/dbos-inc/dbos-transact-golang v1.9.x; this program has "
		if message := err.Error(); !strings.HasPrefix(message, prefix) || strings.Contains(message, "\n") {
			t.Errorf("%q: %q", found, message)
		}
	}
	if err := CheckSDKVersion(""); !strings.HasSuffix(err.Error(), "this program has no version of it") {
		t.Errorf("none: %v", err)
	}
	if err := CheckSDKVersion("v1.8.0"); !strings.HasSuffix(err.Error(), "this program has v1.8.0") {
		t.Errorf("v1.8.0: %v", err)
	}
}

func TestTheVersionIsReadFromTheBuildInformation(t *testing.T) {
	sdk := func(version string, replace *debug.Module) *debug.BuildInfo {
		return &debug.BuildInfo{Deps: []*debug.Module{
			{Path: "github.com/gorilla/websocket", Version: "v1.5.3"},
			{Path: SDKModule, Version: version, Replace: replace},
		}}
	}
	for _, c := range []struct {
		info *debug.BuildInfo
		want string
	}{
		{sdk("v1.9.0", nil), "v1.9.0"},
		{sdk("v1.9.0", &debug.Module{Path: "example.com/fork", Version: "v1.8.2"}), "v1.8.2"},
		{sdk("v1.9.0", &debug.Module{Path: "../dbos-transact-golang"}), ""}, // a directory: anyone's code
		{&debug.BuildInfo{}, ""},
	} {
		if got := sdkVersionIn(c.info); got != c.want {
			t.Errorf("%+v: %q, want %q", c.info.Deps, got, c.want)
		}
	}
}

// A test binary's build information lists no modules, so the pin is read where the build takes it from: go.mod
// (tests/executors/go-current checks the real build information end to end: its executor_info and its 501s name
// v1.9.0).
func TestGoModPinsASupportedRelease(t *testing.T) {
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	pinned := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(SDKModule) + `\s+(\S+)\s*$`).FindStringSubmatch(string(data))
	if pinned == nil {
		t.Fatal("go.mod does not require " + SDKModule)
	}
	if err := CheckSDKVersion(pinned[1]); err != nil {
		t.Fatal(err)
	}
}
