package relay

// Retention on public calls: garbage collection by cutoff and by row threshold, in batches; the global timeout;
// the request answered at once while its round runs in the background.

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

func ptr(n int64) *int64 { return &n }

func TestDrainActsInBatchesUntilAShortOne(t *testing.T) {
	batches := [][]string{{"a", "b"}, {"c", "d"}, {"e"}}
	var acted [][]string
	n, err := drain(func() ([]string, error) {
		next := batches[0]
		batches = batches[1:]
		return next, nil
	}, func(ids []string) error { acted = append(acted, ids); return nil }, 2, func() bool { return false })
	if err != nil || n != 5 || len(acted) != 3 {
		t.Fatalf("drained %d %v %v", n, acted, err)
	}
}

func TestDrainStopsOnARepeatedBatchAnErrorOrAStop(t *testing.T) {
	same := func() ([]string, error) { return []string{"a", "b"}, nil }
	acts := 0
	act := func([]string) error { acts++; return nil }
	if n, err := drain(same, act, 2, func() bool { return false }); n != 2 || err != nil || acts != 1 {
		t.Fatalf("repeated batch: %d %v %d", n, err, acts)
	}
	failure := errors.New("db down")
	if _, err := drain(same, func([]string) error { return failure }, 2, func() bool { return false }); !errors.Is(err, failure) {
		t.Fatalf("error %v", err)
	}
	if n, _ := drain(same, act, 2, func() bool { return true }); n != 0 {
		t.Fatalf("stopped round acted on %d", n)
	}
}

// backdated runs count workflows to their end and makes them old: created and completed at `at` (epoch ms).
func backdated(t *testing.T, count int, at int64) []string {
	t.Helper()
	var ids []string
	for range count {
		id := runWorkflow(t, greet, "old")
		setTimes(t, id, map[string]int64{"created_at": at, "updated_at": at, "completed_at": at})
		ids = append(ids, id)
	}
	return ids
}

func existing(t *testing.T, ids []string) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		if status(t, id) != nil {
			out = append(out, id)
		}
	}
	return out
}

func TestGarbageCollectionByCutoffInBatches(t *testing.T) {
	// Far in the past, so no other test's workflows are older.
	old := backdated(t, 5, 1_000_000)
	atCutoff := backdated(t, 1, 2_000_000) // completed exactly at the cutoff: kept (the cutoff is strict)
	recent := runWorkflow(t, greet, "new")
	pending := startWaiter(t)
	setTimes(t, pending, map[string]int64{"created_at": 1_000_000})
	deleted, cancelled, err := RunRound(env.ctx, Round{GCCutoffEpochMS: ptr(2_000_000), GCBatchSize: ptr(2)}, nil)
	if err != nil || deleted != 5 || cancelled != 0 {
		t.Fatalf("round: %d deleted, %d cancelled, %v", deleted, cancelled, err)
	}
	if got := existing(t, append(append(old, atCutoff...), recent, pending)); !slices.Equal(got, append(atCutoff, recent, pending)) {
		t.Fatalf("left %v", got)
	}
	release(t, pending, "go")
	finished(t, pending, dbos.WorkflowStatusSuccess)
	_ = dbos.DeleteWorkflows(env.ctx, append(atCutoff, pending))
}

func TestGarbageCollectionKeepsTheNewestRows(t *testing.T) {
	// The threshold counts every finished workflow of the app: keep all but a few of them, the oldest.
	before, err := dbos.ListWorkflows(env.ctx, dbos.WithFilterStatus(finishedStatuses...), dbos.WithFilterLoadInput(false),
		dbos.WithFilterLoadOutput(false))
	if err != nil {
		t.Fatal(err)
	}
	oldest := backdated(t, 3, 500_000)
	keep := int64(len(before))
	deleted, _, err := RunRound(env.ctx, Round{GCRowsThreshold: ptr(keep), GCBatchSize: ptr(2)}, nil)
	if err != nil || deleted != 3 {
		t.Fatalf("round: %d deleted, %v", deleted, err)
	}
	if got := existing(t, oldest); len(got) != 0 {
		t.Fatalf("the oldest are still there: %v", got)
	}
	after, _ := dbos.ListWorkflows(env.ctx, dbos.WithFilterStatus(finishedStatuses...), dbos.WithFilterLoadInput(false),
		dbos.WithFilterLoadOutput(false))
	if len(after) != len(before) {
		t.Fatalf("%d finished workflows left, want %d", len(after), len(before))
	}
	// 0 (or less) is no rule: nothing goes.
	if deleted, _, err := RunRound(env.ctx, Round{GCRowsThreshold: ptr(0)}, nil); deleted != 0 || err != nil {
		t.Fatalf("threshold 0: %d deleted, %v", deleted, err)
	}
}

func TestTheGlobalTimeoutCancelsWhatWasCreatedAtOrBeforeTheCutoff(t *testing.T) {
	var parked []string
	for range 3 {
		id := "parked-" + uuid4()
		if _, err := dbos.RunWorkflow(env.ctx, greet, "later", dbos.WithWorkflowID(id), dbos.WithQueue(env.parked)); err != nil {
			t.Fatal(err)
		}
		parked = append(parked, id)
	}
	setTimes(t, parked[0], map[string]int64{"created_at": 3_000_000})
	setTimes(t, parked[1], map[string]int64{"created_at": 3_000_001})
	pending := startWaiter(t)
	setTimes(t, pending, map[string]int64{"created_at": 2_999_999})
	defer func() { _ = dbos.CancelWorkflows(env.ctx, parked) }()
	_, cancelled, err := RunRound(env.ctx, Round{TimeoutCutoffEpochMS: ptr(3_000_000), GCBatchSize: ptr(1)}, nil)
	if err != nil || cancelled != 2 {
		t.Fatalf("round: %d cancelled, %v", cancelled, err)
	}
	for id, want := range map[string]dbos.WorkflowStatusType{parked[0]: dbos.WorkflowStatusCancelled,
		pending: dbos.WorkflowStatusCancelled, parked[1]: dbos.WorkflowStatusEnqueued,
		parked[2]: dbos.WorkflowStatusEnqueued} {
		if got := status(t, id).Status; got != want {
			t.Fatalf("%s is %s, want %s", id, got, want)
		}
	}
}

func TestTheRetentionRequestIsAnsweredAtOnceAndRunsInTheBackground(t *testing.T) {
	a := newAsker(t, false, nil)
	old := backdated(t, 2, 100_000)
	if a.ok("retention", m{"body": m{"gc_cutoff_epoch_ms": 100_001, "gc_rows_threshold": nil,
		"gc_batch_size": nil, "timeout_cutoff_epoch_ms": nil}})["success"] != true {
		t.Fatal("retention")
	}
	eventually(t, 10*time.Second, "the round deleting the old workflows", func() bool {
		return len(existing(t, old)) == 0
	})
	// A request while a round runs is skipped, and still answered "started".
	a.retention.mu.Lock()
	a.retention.running = true
	a.retention.mu.Unlock()
	if a.retention.start(Round{}) {
		t.Fatal("a second round started")
	}
	a.retention.mu.Lock()
	a.retention.running = false
	a.retention.mu.Unlock()
}
