package relay

// Recovery and exist_pending_workflows against executors that really died: processes of the same application (this
// test binary, run as a dead executor by TestMain) that start waiters under an executor id of their own and are
// then SIGKILLed, so their workflows stay PENDING, owned by a dead executor.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

type deadExecutors struct {
	t        *testing.T
	children map[string]*exec.Cmd // by executor id
}

func newDeadExecutors(t *testing.T) *deadExecutors {
	d := &deadExecutors{t: t, children: map[string]*exec.Cmd{}}
	t.Cleanup(func() {
		for _, child := range d.children {
			kill(child)
		}
	})
	return d
}

func kill(child *exec.Cmd) {
	if child.ProcessState == nil {
		_ = child.Process.Kill()
		_ = child.Wait()
	}
}

// start starts a child that owns count waiters under executorID.
func (d *deadExecutors) start(executorID string, count int) {
	dir := d.t.TempDir()
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), "DEAD_EXECUTOR_DB="+env.db, "DEAD_EXECUTOR_ID="+executorID,
		"DEAD_EXECUTOR_COUNT="+strconv.Itoa(count), "DEAD_EXECUTOR_IDS="+filepath.Join(dir, "ids"))
	child.Dir = dir
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = logFile.Close() })
	child.Stdout, child.Stderr = logFile, logFile
	if _, err := child.StdinPipe(); err != nil { // held open: the child waits on it
		d.t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.children[executorID] = child
}

// workflows are the child's workflow ids, once it has started them; the child is then killed.
func (d *deadExecutors) workflows(executorID string) []string {
	child := d.children[executorID]
	dir := child.Dir
	var ids []string
	eventually(d.t, 30*time.Second, executorID+" starting its workflows", func() bool {
		data, err := os.ReadFile(filepath.Join(dir, "ids"))
		if err != nil {
			return false
		}
		ids = strings.Fields(string(data))
		return true
	})
	kill(child)
	return ids
}

func TestRecoveryReEnqueuesExactlyTheDeadExecutorsPendingWorkflows(t *testing.T) {
	a := newAsker(t, false, nil)
	dead := newDeadExecutors(t)
	deadA, deadB := "dead-a-"+uuid4(), "dead-b-"+uuid4()
	dead.start(deadA, 2)
	dead.start(deadB, 1)
	ofA, ofB := dead.workflows(deadA), dead.workflows(deadB)
	own := startWaiter(t)
	for _, c := range []struct {
		ids   []string
		owner string
	}{{ofA, deadA}, {ofB, deadB}} {
		for _, id := range c.ids {
			s := status(t, id)
			if s.Status != dbos.WorkflowStatusPending || s.ExecutorID != c.owner || s.ApplicationVersion != appVersion {
				t.Fatalf("%s: %s %s %s", id, s.Status, s.ExecutorID, s.ApplicationVersion)
			}
		}
	}
	exists := func(executorID string) any {
		return a.ok("exist_pending_workflows", m{"executor_id": executorID, "application_version": appVersion})["exist"]
	}
	if exists(deadA) != true {
		t.Fatal("no pending workflow of the dead executor")
	}

	if a.ok("recovery", m{"executor_ids": []string{deadA}})["success"] != true {
		t.Fatal("recovery")
	}

	if exists(deadA) != false {
		t.Fatal("pending workflows left after the recovery")
	}
	for _, id := range ofA { // back on a queue, then run here: the message lets them finish
		release(t, id, "never")
	}
	for _, id := range ofA {
		if w := finished(t, id, dbos.WorkflowStatusSuccess); w.Output != `"released"` || w.ExecutorID != env.executorID {
			t.Fatalf("recovered %s: %#v on %s", id, w.Output, w.ExecutorID)
		}
	}
	// Another dead executor's workflows are not touched, nor this executor's.
	for _, c := range []struct{ id, owner string }{{ofB[0], deadB}, {own, env.executorID}} {
		if s := status(t, c.id); s.Status != dbos.WorkflowStatusPending || s.ExecutorID != c.owner || s.QueueName != "" {
			t.Fatalf("%s: %s %s %q", c.id, s.Status, s.ExecutorID, s.QueueName)
		}
	}
	if exists(deadB) != true {
		t.Fatal("the other dead executor's workflows are gone")
	}

	// A second request for the same id finds nothing and still succeeds.
	a.ok("recovery", m{"executor_ids": []string{deadA}})
	// Both ids in one request: the one recovered already finds nothing, the other's workflows come back.
	a.ok("recovery", m{"executor_ids": []string{deadA, deadB}})
	release(t, ofB[0], "never")
	if w := finished(t, ofB[0], dbos.WorkflowStatusSuccess); w.ExecutorID != env.executorID {
		t.Fatalf("recovered on %s", w.ExecutorID)
	}
	release(t, own, "go")
	finished(t, own, dbos.WorkflowStatusSuccess)
}

func TestExistPendingWorkflows(t *testing.T) {
	a := newAsker(t, false, nil)
	pending := startWaiter(t)
	defer func() {
		release(t, pending, "go")
		finished(t, pending, dbos.WorkflowStatusSuccess)
	}()
	for _, c := range []struct {
		executorID, version string
		exist               bool
	}{{env.executorID, appVersion, true}, {"another-id", appVersion, false}, {env.executorID, "v0", false}} {
		reply := a.ok("exist_pending_workflows", m{"executor_id": c.executorID, "application_version": c.version})
		if reply["exist"] != c.exist {
			t.Fatalf("%v: %v", c, reply)
		}
	}
}
