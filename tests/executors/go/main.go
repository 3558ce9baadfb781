// A real DBOS Go executor (github.com/dbos-inc/dbos-transact-golang, pinned in go.mod) for end-to-end tests,
// run as a subprocess; the Go counterpart of tests/executor_app.py.
//
// Environment: RELAY_URL (the conductor URL, ws://host:port/), RELAY_KEY, APP_NAME, APP_VERSION (default v1),
// SYS_DB (SQLite system database path), STEP_LOG (file that each step appends "<pid> <step>" to), STEP_SECONDS
// (default 0.3), EXECUTOR_METADATA (a JSON object, sent as executor_metadata), and START_WORKFLOW (a workflow id to
// start once the file START_WORKFLOW_WHEN exists). For retention tests: FINISHED_WORKFLOWS (comma-separated
// workflow ids run to completion at launch) and PENDING_WORKFLOWS (comma-separated ids started at launch that
// wait, PENDING, for an hour).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite"
)

const steps = 20

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func ids(name string) []string {
	var out []string
	for _, id := range strings.Split(os.Getenv(name), ",") {
		if id != "" {
			out = append(out, id)
		}
	}
	return out
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(1)
	}
}

func main() {
	stepSeconds, err := strconv.ParseFloat(env("STEP_SECONDS", "0.3"), 64)
	must(err)
	stepLog := os.Getenv("STEP_LOG")
	var metadata map[string]any
	if raw := os.Getenv("EXECUTOR_METADATA"); raw != "" {
		must(json.Unmarshal([]byte(raw), &metadata))
	}

	ctx, err := dbos.NewContext(context.Background(), dbos.Config{
		AppName:                   os.Getenv("APP_NAME"),
		DatabaseURL:               "sqlite:" + os.Getenv("SYS_DB"),
		ApplicationVersion:        env("APP_VERSION", "v1"),
		ConductorURL:              os.Getenv("RELAY_URL"),
		ConductorAPIKey:           os.Getenv("RELAY_KEY"),
		ConductorExecutorMetadata: metadata,
	})
	must(err)
	executorID := ctx.GetExecutorID()

	step := func(i int) dbos.Step[int] {
		return func(context.Context) (int, error) {
			time.Sleep(time.Duration(stepSeconds * float64(time.Second)))
			f, err := os.OpenFile(stepLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return 0, err
			}
			defer f.Close()
			_, err = fmt.Fprintf(f, "%d %d\n", os.Getpid(), i)
			return i, err
		}
	}
	twentySteps := func(ctx dbos.Context, _ string) (int, error) {
		sum := 0
		for i := range steps {
			n, err := dbos.RunAsStep(ctx, step(i), dbos.WithStepName(fmt.Sprintf("step-%d", i)))
			if err != nil {
				return 0, err
			}
			sum += n
		}
		return sum, nil
	}
	finishes := func(ctx dbos.Context, _ string) (string, error) { return "done", nil }
	waits := func(ctx dbos.Context, _ string) (time.Duration, error) { return dbos.Sleep(ctx, time.Hour) }
	dbos.RegisterWorkflow(ctx, twentySteps, dbos.WithWorkflowName("twenty_steps"))
	dbos.RegisterWorkflow(ctx, finishes, dbos.WithWorkflowName("finishes"))
	dbos.RegisterWorkflow(ctx, waits, dbos.WithWorkflowName("waits"))
	must(dbos.Launch(ctx))
	fmt.Println("executor", executorID, "launched")
	for _, id := range ids("FINISHED_WORKFLOWS") {
		handle, err := dbos.RunWorkflow(ctx, finishes, "", dbos.WithWorkflowID(id))
		must(err)
		_, err = handle.GetResult()
		must(err)
	}
	for _, id := range ids("PENDING_WORKFLOWS") {
		_, err := dbos.RunWorkflow(ctx, waits, "", dbos.WithWorkflowID(id))
		must(err)
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if workflowID := os.Getenv("START_WORKFLOW"); workflowID != "" {
		when := os.Getenv("START_WORKFLOW_WHEN")
		for {
			if _, err := os.Stat(when); err == nil {
				break
			}
			select {
			case <-stop:
				dbos.Shutdown(ctx, 5*time.Second)
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		_, err := dbos.RunWorkflow(ctx, twentySteps, "", dbos.WithWorkflowID(workflowID))
		must(err)
		fmt.Println("started workflow", workflowID)
	}
	<-stop
	dbos.Shutdown(ctx, 5*time.Second)
}
