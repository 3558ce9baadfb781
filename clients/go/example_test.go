package relay_test

// The README's example, compiled with the tests (not run: it needs a system database and a Relay).

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	relay "relay.dev/relay-dbos-go"
)

func Example() {
	ctx, err := dbos.NewContext(context.Background(), dbos.Config{
		AppName:            "orders",
		DatabaseURL:        os.Getenv("DBOS_SYSTEM_DATABASE_URL"),
		ApplicationVersion: "v1",
		ExecutorID:         relay.ExecutorID(), // a new UUID per process; a fixed one may be set
	})
	if err != nil {
		log.Fatal(err)
	}
	// dbos.RegisterWorkflow(ctx, ...) for each workflow, then:
	if err := dbos.Launch(ctx); err != nil {
		log.Fatal(err)
	}
	// Returns at once; the socket lives on goroutines of its own. URL and Key: RELAY_URL and RELAY_API_KEY when empty.
	r, err := relay.Connect(ctx, relay.Options{URL: "ws://relay:8090/", Key: os.Getenv("RELAY_API_KEY")})
	if err != nil {
		log.Fatal(err) // an SDK release other than v1.9.x, or no URL, key or app name: one line
	}
	// ... serve ...
	_ = dbos.Shutdown(ctx, 30*time.Second)
	r.Close() // after Shutdown: the socket outlives the workflows it lets finish
}
