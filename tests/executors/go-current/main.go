// A real DBOS Go executor on the current SDK (github.com/dbos-inc/dbos-transact-golang v1.9.0, pinned in go.mod),
// connected through Relay's own client (relay.dev/relay-dbos-go, clients/go, by a replace directive) instead of a
// conductor key, for the end-to-end tests; the counterpart of tests/executors/go/main.go (v1.6.0, built-in client)
// and of tests/executors/python/executor.py (dbos 3.4.0 through clients/python).
//
// Environment (tests/sdk.py): RELAY_URL (Relay's base URL, ws://host:port/), RELAY_KEY, APP_NAME, APP_VERSION
// (default v1), SYS_DB (SQLite system database path) or SYS_DB_URL (PostgreSQL), STEP_LOG (file that each step
// appends "<pid> <step>" to), STEP_SECONDS (default 0.3), EXECUTOR_METADATA (a JSON object, sent as
// executor_metadata), START_WORKFLOW (a workflow id to start once the file START_WORKFLOW_WHEN exists),
// FINISHED_WORKFLOWS (ids run to completion at launch), PENDING_WORKFLOWS (ids started at launch that wait, PENDING,
// for an hour); as the Python one also GATED_WORKFLOWS / GATE_DIR, QUEUED_WORKFLOWS, THREE_STEPS, SCHEDULE; and
// RELAY_PING_SECS / RELAY_PONG_TIMEOUT_SECS, the client's keepalive (20 s and 15 s unless set), EXECUTOR_ID (a
// fixed id; a new UUID per process unless set).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite"
	relay "relay.dev/relay-dbos-go"
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

func seconds(name string, fallback float64) time.Duration {
	s, err := strconv.ParseFloat(env(name, strconv.FormatFloat(fallback, 'f', -1, 64)), 64)
	must(err)
	return time.Duration(s * float64(time.Second))
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, line)
	return err
}

func main() {
	stepSeconds := seconds("STEP_SECONDS", 0.3)
	stepLog := os.Getenv("STEP_LOG")
	var metadata map[string]any
	if raw := os.Getenv("EXECUTOR_METADATA"); raw != "" {
		must(json.Unmarshal([]byte(raw), &metadata))
	}
	database := os.Getenv("SYS_DB_URL")
	if path := os.Getenv("SYS_DB"); path != "" {
		database = "sqlite:" + path
	}
	executorID := os.Getenv("EXECUTOR_ID")
	if executorID == "" {
		executorID = relay.ExecutorID()
	}

	ctx, err := dbos.NewContext(context.Background(), dbos.Config{
		AppName:            os.Getenv("APP_NAME"),
		DatabaseURL:        database,
		ApplicationVersion: env("APP_VERSION", "v1"),
		ExecutorID:         executorID,
	})
	must(err)

	step := func(i int) dbos.Step[int] {
		return func(context.Context) (int, error) {
			time.Sleep(stepSeconds)
			return i, appendLine(stepLog, fmt.Sprintf("%d %d", os.Getpid(), i))
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
	finishes := func(ctx dbos.Context, _ string) (string, error) {
		return "done", dbos.SetEvent(ctx, "answer", 42)
	}
	waits := func(ctx dbos.Context, _ string) (time.Duration, error) { return dbos.Sleep(ctx, time.Hour) }
	// gated polls its gate file (each look a checkpointed step): cancelled meanwhile it stays so; resumed, it goes on.
	gated := func(ctx dbos.Context, _ string) (string, error) {
		workflowID, err := dbos.GetWorkflowID(ctx)
		if err != nil {
			return "", err
		}
		for {
			open, err := dbos.RunAsStep(ctx, func(context.Context) (bool, error) {
				_, err := os.Stat(filepath.Join(os.Getenv("GATE_DIR"), workflowID))
				return err == nil, nil
			}, dbos.WithStepName("gate_open"))
			if err != nil || open {
				return "opened", err
			}
			if _, err := dbos.Sleep(ctx, 200*time.Millisecond); err != nil {
				return "", err
			}
		}
	}
	threeSteps := func(ctx dbos.Context, _ string) (int, error) {
		workflowID, err := dbos.GetWorkflowID(ctx)
		if err != nil {
			return 0, err
		}
		sum := 0
		for i := range 3 {
			n, err := dbos.RunAsStep(ctx, func(context.Context) (int, error) {
				return i, appendLine(stepLog, fmt.Sprintf("%d %s %d", os.Getpid(), workflowID, i))
			}, dbos.WithStepName("logged_step"))
			if err != nil {
				return 0, err
			}
			sum += n
		}
		return sum, nil
	}
	scheduled := func(ctx dbos.Context, in dbos.ScheduledWorkflowInput) (string, error) {
		return in.ScheduledTime.Format(time.RFC3339), nil
	}
	dbos.RegisterWorkflow(ctx, twentySteps, dbos.WithWorkflowName("twenty_steps"))
	dbos.RegisterWorkflow(ctx, finishes, dbos.WithWorkflowName("finishes"))
	dbos.RegisterWorkflow(ctx, waits, dbos.WithWorkflowName("waits"))
	dbos.RegisterWorkflow(ctx, gated, dbos.WithWorkflowName("gated"))
	dbos.RegisterWorkflow(ctx, threeSteps, dbos.WithWorkflowName("three_steps"))
	dbos.RegisterWorkflow(ctx, scheduled, dbos.WithWorkflowName("scheduled"))
	must(dbos.Launch(ctx))
	connection, err := relay.Connect(ctx, relay.Options{
		URL: os.Getenv("RELAY_URL"), Key: os.Getenv("RELAY_KEY"), AppName: os.Getenv("APP_NAME"),
		ExecutorMetadata: metadata, PingInterval: seconds("RELAY_PING_SECS", 20),
		PongTimeout: seconds("RELAY_PONG_TIMEOUT_SECS", 15),
	})
	must(err)
	fmt.Println("executor", ctx.GetExecutorID(), "launched")

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
	for _, id := range ids("GATED_WORKFLOWS") {
		_, err := dbos.RunWorkflow(ctx, gated, "", dbos.WithWorkflowID(id))
		must(err)
	}
	if queued := ids("QUEUED_WORKFLOWS"); len(queued) > 0 {
		serial, err := dbos.RegisterQueue(ctx, "serial", dbos.WithGlobalConcurrency(1))
		must(err)
		for _, id := range queued {
			_, err := dbos.RunWorkflow(ctx, gated, "", dbos.WithWorkflowID(id), dbos.WithQueue(serial))
			must(err)
		}
	}
	for _, id := range ids("THREE_STEPS") {
		handle, err := dbos.RunWorkflow(ctx, threeSteps, "", dbos.WithWorkflowID(id))
		must(err)
		_, err = handle.GetResult()
		must(err)
	}
	if name := os.Getenv("SCHEDULE"); name != "" {
		must(dbos.CreateSchedule(ctx, dbos.ScheduleSpec{ScheduleName: name, Schedule: "0 0 * * * *",
			Workflow: scheduled}))
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	shutdown := func() {
		_ = dbos.Shutdown(ctx, 5*time.Second)
		connection.Close() // after Shutdown: the socket outlives the workflows it lets finish
	}
	if workflowID := os.Getenv("START_WORKFLOW"); workflowID != "" {
		for {
			if _, err := os.Stat(os.Getenv("START_WORKFLOW_WHEN")); err == nil {
				break
			}
			select {
			case <-stop:
				shutdown()
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		_, err := dbos.RunWorkflow(ctx, twentySteps, "", dbos.WithWorkflowID(workflowID))
		must(err)
		fmt.Println("started workflow", workflowID)
	}
	<-stop
	shutdown()
}
