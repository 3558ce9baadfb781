// Package relay connects a DBOS Transact (Go) application to Relay, the self-hosted control plane for DBOS
// executors, on the SDK's MIT-licensed public API.
//
// Use it instead of a conductor key:
//
//	ctx, _ := dbos.NewContext(context.Background(), dbos.Config{..., ExecutorID: relay.ExecutorID()})
//	dbos.Launch(ctx)
//	r, err := relay.Connect(ctx, relay.Options{URL: "ws://relay:8090/", Key: os.Getenv("RELAY_API_KEY")})
//	...
//	dbos.Shutdown(ctx, 30*time.Second)
//	r.Close()
//
// It never imports the commercial add-on, never sets a conductor key, never registers a conductor factory and does
// not touch the SDK's entitlement code: it is an application-level client of Relay. The one call it makes outside
// the SDK's public API is the recovery of another executor's workflows (recovery.go). The SDK built into the
// program must be in SupportedSDK; Connect refuses any other, in one line.
package relay

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

var (
	processID     string
	processIDOnce sync.Once
)

// ExecutorID is this process's executor id for dbos.Config.ExecutorID: a UUID drawn once per process.
//
// Relay recovers a dead executor by the id DBOS recorded as the owner of its workflows, so every process needs an
// id of its own, and DBOS, run without a conductor, records the id from its config ("local" when none is set, the
// same for every process). A restarted process is therefore a new executor: its predecessor's PENDING workflows come
// back through Relay's recovery by a peer. A fixed id (a StatefulSet pod's name) may be set instead; then Launch
// itself recovers that id's PENDING workflows of the running version, and Relay sees the same executor come back.
// DBOS__VMID, when set, wins over either.
func ExecutorID() string {
	processIDOnce.Do(func() {
		var b [16]byte
		_, _ = rand.Read(b[:])  // crypto/rand.Read never fails (Go >= 1.24)
		b[6] = b[6]&0x0f | 0x40 // version 4
		b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
		processID = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	})
	return processID
}

// Options of Connect. URL and Key are needed; the rest have defaults.
type Options struct {
	URL              string         // Relay's base URL (ws://relay:8090/); RELAY_URL when empty
	Key              string         // an API key of Relay's; RELAY_API_KEY when empty
	AppName          string         // DBOS's Config.AppName; read from the system database when empty
	ExecutorMetadata map[string]any // any JSON object, shown with the executor
	OnAlert          AlertHandler   // takes Relay's alerts; they are logged when nil
	MetadataOnly     bool           // inputs, outputs and workflow data never leave the process
	PingInterval     time.Duration  // PingInterval (20 s) when 0
	PongTimeout      time.Duration  // PongTimeout (15 s) when 0
	Backoff          *Backoff       // NewBackoff() when nil
	Logger           *slog.Logger   // slog.Default() when nil; the key is never logged
}

// Relay is a connection to Relay, kept up on goroutines of its own until Close.
type Relay struct {
	connection *connection
	retention  *retention
	closeOnce  sync.Once
}

// Connected is true while a socket to Relay is open and has been answered on.
func (r *Relay) Connected() bool { return r.connection.up() }

// WaitConnected waits until Connected, at most timeout; whether it is.
func (r *Relay) WaitConnected(timeout time.Duration) bool { return r.connection.waitConnected(timeout) }

// Close closes the socket cleanly and stops the goroutines (a retention round ends at its next batch); idempotent.
// Call it after dbos.Shutdown: Relay takes a closed socket for a disconnect and, past the app's grace, recovers the
// executor's PENDING workflows elsewhere, so the socket should outlive the workflows Shutdown lets finish.
func (r *Relay) Close() {
	r.closeOnce.Do(func() {
		r.connection.close(5 * time.Second)
		r.retention.wait(5 * time.Second)
	})
}

// appName is the application's name as DBOS registered it: the owner of the running version (public
// ListApplicationVersions), for a Connect that was not told it.
func appName(ctx dbos.Context) (string, error) {
	versions, err := dbos.ListApplicationVersions(ctx)
	if err != nil {
		return "", fmt.Errorf("relay.Connect: cannot read the application's name: %w", err)
	}
	for _, v := range versions {
		if v.Name == ctx.GetApplicationVersion() && v.ApplicationName != "" {
			return v.ApplicationName, nil
		}
	}
	return "", errors.New("relay.Connect: cannot tell the application's name; set Options.AppName (DBOS's AppName)")
}

// Connect connects this launched DBOS application to Relay, on goroutines of its own, and returns at once. It
// fails only when it cannot start: the SDK is not a supported release, or the URL, the key or the application's
// name is missing. Relay being down is no failure: the connection is tried again until Close.
func Connect(ctx dbos.Context, opts Options) (*Relay, error) {
	found := sdkVersion()
	if err := CheckSDKVersion(found); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, errors.New("relay.Connect: no DBOS context")
	}
	if opts.URL == "" {
		opts.URL = os.Getenv("RELAY_URL")
	}
	if opts.Key == "" {
		opts.Key = os.Getenv("RELAY_API_KEY")
	}
	if opts.URL == "" {
		return nil, errors.New("relay.Connect: no Relay URL (set Options.URL or RELAY_URL)")
	}
	if opts.Key == "" {
		return nil, errors.New("relay.Connect: no API key (set Options.Key or RELAY_API_KEY)")
	}
	if opts.AppName == "" {
		name, err := appName(ctx)
		if err != nil {
			return nil, err
		}
		opts.AppName = name
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = PingInterval
	}
	if opts.PongTimeout <= 0 {
		opts.PongTimeout = PongTimeout
	}
	if opts.Backoff == nil {
		opts.Backoff = NewBackoff()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Relay{}
	r.retention = &retention{ctx: ctx, log: opts.Logger, stopped: func() bool { return r.connection.isStopping() }}
	ops := &operations{ctx: ctx, metadata: opts.ExecutorMetadata, onAlert: opts.OnAlert,
		metadataOnly: opts.MetadataOnly, retention: r.retention, sdkVersion: found, log: opts.Logger}
	r.connection = newConnection(opts.URL, opts.AppName, opts.Key, ops.table(), opts.MetadataOnly,
		opts.PingInterval, opts.PongTimeout, opts.Backoff, opts.Logger)
	r.connection.start()
	return r, nil
}
