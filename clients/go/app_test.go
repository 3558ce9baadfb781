package relay

// The DBOS application the client's tests run: one real DBOS v1.9.0 per test binary, launched by TestMain on a
// SQLite file and shut down at its end; the same binary, run with DEAD_EXECUTOR_* set, is the short-lived "dead
// executor" of the recovery tests.
//
// DBOS requires every workflow to be registered before Launch, so they are all registered here, with explicit
// names: the test process and its children register the same ones, and a workflow a child started can be
// recovered and run by the test process.

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite"
)

const (
	testApp     = "relay-client-tests"
	appVersion  = "v1"
	workQueue   = "work"   // listened to by the test process
	parkedQueue = "parked" // listened to by no process: what is enqueued on it stays ENQUEUED
	waitFor     = 20 * time.Second
)

// env is the launched DBOS of this test binary.
var env struct {
	ctx        dbos.Context
	dir        string
	db         string // the SQLite file
	executorID string
	parked     dbos.Queue
	mu         sync.Mutex
	waiters    []string // waiters started by tests, released at the end
}

func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func token(context.Context) (string, error) { return uuid4(), nil }

func broken(context.Context) (string, error) { return "", fmt.Errorf("broken %s", uuid4()) }

func greet(ctx dbos.Context, name string) (string, error) {
	t, err := dbos.RunAsStep(ctx, token, dbos.WithStepName("token"))
	return "hello " + name + " " + t, err
}

// caughtFailure: its first step succeeds, the second fails (caught), the third succeeds: the last failed step is
// not the last step.
func caughtFailure(ctx dbos.Context, _ string) (string, error) {
	first, err := dbos.RunAsStep(ctx, token, dbos.WithStepName("token"))
	if err != nil {
		return "", err
	}
	_, _ = dbos.RunAsStep(ctx, broken, dbos.WithStepName("broken"))
	last, err := dbos.RunAsStep(ctx, token, dbos.WithStepName("token"))
	return first + last, err
}

// failing: its first step succeeds, the second fails the workflow (ERROR).
func failing(ctx dbos.Context, _ string) (string, error) {
	if _, err := dbos.RunAsStep(ctx, token, dbos.WithStepName("token")); err != nil {
		return "", err
	}
	return dbos.RunAsStep(ctx, broken, dbos.WithStepName("broken"))
}

// waiter stays PENDING until a message on topic is sent to it.
func waiter(ctx dbos.Context, topic string) (string, error) {
	return dbos.Recv[string](ctx, topic, waitFor)
}

type event struct{ Key, Value string }

func withEvent(ctx dbos.Context, e event) (string, error) {
	return "", dbos.SetEvent(ctx, e.Key, e.Value)
}

// tick is the workflow of the tests' schedules.
func tick(ctx dbos.Context, in dbos.ScheduledWorkflowInput) (string, error) {
	return "", dbos.SetEvent(ctx, "scheduled_at", in.ScheduledTime.UTC().Format(time.RFC3339))
}

func launch(db, executorID string) (dbos.Context, error) {
	ctx, err := dbos.NewContext(context.Background(), dbos.Config{
		AppName: testApp, DatabaseURL: "sqlite:" + db, ApplicationVersion: appVersion, ExecutorID: executorID,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return nil, err
	}
	dbos.RegisterWorkflow(ctx, greet, dbos.WithWorkflowName("greet"))
	dbos.RegisterWorkflow(ctx, caughtFailure, dbos.WithWorkflowName("caught_failure"))
	dbos.RegisterWorkflow(ctx, failing, dbos.WithWorkflowName("failing"))
	dbos.RegisterWorkflow(ctx, waiter, dbos.WithWorkflowName("waiter"))
	dbos.RegisterWorkflow(ctx, withEvent, dbos.WithWorkflowName("with_event"))
	dbos.RegisterWorkflow(ctx, tick, dbos.WithWorkflowName("tick"))
	dbos.ListenQueues(ctx, workQueue)
	if err := dbos.Launch(ctx); err != nil {
		return nil, err
	}
	return ctx, nil
}

func TestMain(m *testing.M) {
	if os.Getenv("PRINT_EXECUTOR_ID") != "" { // another process, for TestAnotherProcessDrawsAnotherExecutorID
		fmt.Println(ExecutorID())
		return
	}
	if db := os.Getenv("DEAD_EXECUTOR_DB"); db != "" {
		deadExecutor(db)
		return
	}
	os.Exit(run(m))
}

// pinnedSDK stands for the build information a test binary lacks (it lists no modules): the release go.mod pins,
// which TestGoModPinsASupportedRelease checks.
func pinnedSDK() string { return "v1.9.0" }

func run(m *testing.M) int {
	sdkVersion = pinnedSDK
	// tmpfs when there is one: SQLite's fsyncs on a disk make each workflow much slower.
	base := ""
	if info, err := os.Stat("/dev/shm"); err == nil && info.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "relay-dbos-go-tests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	env.dir, env.db, env.executorID = dir, filepath.Join(dir, "sys.sqlite"), ExecutorID()
	if env.ctx, err = launch(env.db, env.executorID); err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
		return 1
	}
	if _, err = dbos.RegisterQueue(env.ctx, workQueue, dbos.WithWorkerConcurrency(4)); err == nil {
		env.parked, err = dbos.RegisterQueue(env.ctx, parkedQueue)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "queues:", err)
		return 1
	}
	code := m.Run()
	for _, id := range env.waiters { // a waiter holds a goroutine until its message comes
		_ = dbos.Send(env.ctx, id, "released", "go")
	}
	if err := dbos.Shutdown(env.ctx, 5*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "shutdown:", err)
	}
	return code
}

// deadExecutor is a dead executor in the making: it launches DBOS with DEAD_EXECUTOR_ID, starts
// DEAD_EXECUTOR_COUNT waiters (PENDING, owned by that id), writes their ids to DEAD_EXECUTOR_IDS (one a line; the
// file appears whole) and waits to be killed (or for its standard input to close).
func deadExecutor(db string) {
	ctx, err := launch(db, os.Getenv("DEAD_EXECUTOR_ID"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dead executor:", err)
		os.Exit(2)
	}
	var count int
	_, _ = fmt.Sscan(os.Getenv("DEAD_EXECUTOR_COUNT"), &count)
	var ids []string
	for range count {
		handle, err := dbos.RunWorkflow(ctx, waiter, "never")
		if err != nil {
			fmt.Fprintln(os.Stderr, "dead executor:", err)
			os.Exit(2)
		}
		ids = append(ids, handle.GetWorkflowID())
	}
	out := os.Getenv("DEAD_EXECUTOR_IDS")
	if err := os.WriteFile(out+".partial", []byte(strings.Join(ids, "\n")+"\n"), 0o600); err != nil {
		os.Exit(2)
	}
	_ = os.Rename(out+".partial", out)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

// -- helpers ------------------------------------------------------------------------------------------------------

// eventually polls probe until it is true, at most timeout.
func eventually(t *testing.T, timeout time.Duration, what string, probe func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !probe() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func status(t *testing.T, id string) *dbos.WorkflowStatus {
	t.Helper()
	found, err := dbos.ListWorkflows(env.ctx, dbos.WithFilterWorkflowIDs(id))
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		return nil
	}
	return &found[0]
}

// finished waits for the workflow to reach want (a resumed, forked or recovered one runs from a queue).
func finished(t *testing.T, id string, want dbos.WorkflowStatusType) dbos.WorkflowStatus {
	t.Helper()
	var last *dbos.WorkflowStatus
	eventually(t, 15*time.Second, "workflow "+id+" reaching "+string(want), func() bool {
		last = status(t, id)
		return last != nil && last.Status == want
	})
	return *last
}

// runWorkflow runs a workflow to its end under a new id; the id.
func runWorkflow[P any](t *testing.T, fn dbos.Workflow[P, string], input P) string {
	t.Helper()
	id := "wf-" + uuid4()
	handle, err := dbos.RunWorkflow(env.ctx, fn, input, dbos.WithWorkflowID(id))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = handle.GetResult() // failing fails: its status says so
	return id
}

func startWaiter(t *testing.T) string {
	t.Helper()
	handle, err := dbos.RunWorkflow(env.ctx, waiter, "go")
	if err != nil {
		t.Fatal(err)
	}
	env.mu.Lock()
	env.waiters = append(env.waiters, handle.GetWorkflowID())
	env.mu.Unlock()
	return handle.GetWorkflowID()
}

func release(t *testing.T, id, topic string) {
	t.Helper()
	if err := dbos.Send(env.ctx, id, "released", topic); err != nil {
		t.Fatal(err)
	}
}

// setTimes overwrites epoch-ms columns of one workflow's row, as an old workflow has them.
func setTimes(t *testing.T, id string, columns map[string]int64) {
	t.Helper()
	db, err := sql.Open("sqlite", env.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for column, value := range columns {
		result, err := db.Exec("UPDATE workflow_status SET "+column+" = ? WHERE workflow_uuid = ?", value, id)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := result.RowsAffected(); n != 1 {
			t.Fatalf("no row for workflow %s", id)
		}
	}
}

// -- asking the operations table ----------------------------------------------------------------------------------

type alert struct {
	name, message string
	metadata      map[string]string
}

// asker sends requests through Handle with the real operations table, as the socket's goroutine does.
type asker struct {
	t            *testing.T
	table        map[string]Operation
	metadataOnly bool
	mu           sync.Mutex
	alerts       []alert
	retention    *retention
}

func newAsker(t *testing.T, metadataOnly bool, metadata map[string]any) *asker {
	a := &asker{t: t, metadataOnly: metadataOnly}
	stopping := false
	var mu sync.Mutex
	a.retention = &retention{ctx: env.ctx, log: slog.Default(), stopped: func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stopping
	}}
	t.Cleanup(func() {
		mu.Lock()
		stopping = true
		mu.Unlock()
		if !a.retention.wait(10 * time.Second) {
			t.Error("a retention round did not end")
		}
	})
	ops := &operations{ctx: env.ctx, metadata: metadata, metadataOnly: metadataOnly, retention: a.retention,
		sdkVersion: "v1.9.0", log: slog.Default(), onAlert: func(name, message string, m map[string]string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.alerts = append(a.alerts, alert{name, message, m})
		}}
	a.table = ops.table()
	return a
}

func (a *asker) raw(frame string) map[string]any {
	a.t.Helper()
	var reply map[string]any
	if err := json.Unmarshal(Handle([]byte(frame), a.table, a.metadataOnly, slog.Default()), &reply); err != nil {
		a.t.Fatal(err)
	}
	if _, ok := reply["error_message"]; !ok {
		a.t.Fatalf("no error_message in %v", reply)
	}
	return reply
}

// ask is the reply to a request of type kind; its type and request_id are checked here.
func (a *asker) ask(kind string, fields map[string]any) map[string]any {
	a.t.Helper()
	requestID := uuid4()
	request := map[string]any{"type": kind, "request_id": requestID}
	for k, v := range fields {
		request[k] = v
	}
	frame, err := json.Marshal(request)
	if err != nil {
		a.t.Fatal(err)
	}
	reply := a.raw(string(frame))
	if reply["type"] != kind || reply["request_id"] != requestID {
		a.t.Fatalf("reply %v does not match request %s %s", reply, kind, requestID)
	}
	return reply
}

// ok is ask, and the reply must report no error.
func (a *asker) ok(kind string, fields map[string]any) map[string]any {
	a.t.Helper()
	reply := a.ask(kind, fields)
	if reply["error_message"] != nil {
		a.t.Fatalf("%s: %v", kind, reply["error_message"])
	}
	return reply
}

type m = map[string]any

// list is a reply field that is a list of objects.
func list(t *testing.T, v any) []m {
	t.Helper()
	items, ok := v.([]any)
	if !ok {
		t.Fatalf("not a list: %#v", v)
	}
	out := make([]m, len(items))
	for i, item := range items {
		if out[i], ok = item.(m); !ok {
			t.Fatalf("not an object: %#v", item)
		}
	}
	return out
}
