package relay

// Relay's retention request on DBOS's public API: v1.7 moved garbage collection and the global timeout out of the
// MIT-licensed module, and both are sound as lists and bulk actions.
//
//   - Garbage collection: the application's finished workflows (SUCCESS, ERROR, CANCELLED,
//     MAX_RECOVERY_ATTEMPTS_EXCEEDED) completed before gc_cutoff_epoch_ms are deleted with everything they hold
//     (DeleteWorkflows), and so are those beyond the gc_rows_threshold newest, a batch of gc_batch_size ids at a
//     time (at most DeleteMax: a bulk delete is one statement, and SQLite takes 32,766 parameters at most).
//   - The global timeout: the application's PENDING, ENQUEUED, DELAYED and SUSPENDED workflows created at or before
//     timeout_cutoff_epoch_ms are cancelled (CancelWorkflows), a batch at a time.
//
// As v1.6.0 did, a round runs on a goroutine of its own, so the request is answered at once ("started") and every
// other request keeps being answered meanwhile; a request while a round runs is skipped, with a warning.

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// Batch sizes of a retention round.
const (
	DefaultBatch = 10_000
	DeleteMax    = 10_000
)

var (
	finishedStatuses = []dbos.WorkflowStatusType{dbos.WorkflowStatusSuccess, dbos.WorkflowStatusError,
		dbos.WorkflowStatusCancelled, dbos.WorkflowStatusMaxRecoveryAttemptsExceeded}
	activeStatuses = []dbos.WorkflowStatusType{dbos.WorkflowStatusPending, dbos.WorkflowStatusEnqueued,
		dbos.WorkflowStatusDelayed, dbos.WorkflowStatusSuspended}
)

// Round is one retention request's body; a nil field is a rule not applied.
type Round struct {
	GCCutoffEpochMS      *int64
	GCRowsThreshold      *int64
	GCBatchSize          *int64
	TimeoutCutoffEpochMS *int64
}

// drain acts on batch() until it returns fewer than size ids; how many were acted on. A batch that repeats the last
// one's ids (the action took nothing away) ends the round rather than looping; so does stop.
func drain(batch func() ([]string, error), act func([]string) error, size int, stop func() bool) (int, error) {
	total := 0
	var last []string
	for !stop() {
		ids, err := batch()
		if err != nil || len(ids) == 0 || slices.Equal(ids, last) {
			return total, err
		}
		if err := act(ids); err != nil {
			return total, err
		}
		total += len(ids)
		if len(ids) < size {
			return total, nil
		}
		last = ids
	}
	return total, nil
}

func listIDs(ctx dbos.Context, opts ...dbos.ListWorkflowsOption) ([]string, error) {
	opts = append(opts, dbos.WithFilterLoadInput(false), dbos.WithFilterLoadOutput(false))
	found, err := dbos.ListWorkflows(ctx, opts...)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(found))
	for i, w := range found {
		out[i] = w.ID
	}
	return out, nil
}

// RunRound runs one round in the calling goroutine: (workflows deleted, workflows cancelled). stop, checked between
// batches, ends it early (nil: never).
func RunRound(ctx dbos.Context, round Round, stop func() bool) (deleted, cancelled int, err error) {
	if stop == nil {
		stop = func() bool { return false }
	}
	size := DefaultBatch
	if round.GCBatchSize != nil && *round.GCBatchSize > 0 {
		size = int(min(*round.GCBatchSize, DeleteMax))
	}
	remove := func(ids []string) error { return dbos.DeleteWorkflows(ctx, ids) }
	if round.GCCutoffEpochMS != nil {
		// The SDK's bound is inclusive (completed_at <= t), the protocol's strict.
		before := time.UnixMilli(*round.GCCutoffEpochMS - 1)
		n, err := drain(func() ([]string, error) {
			return listIDs(ctx, dbos.WithFilterStatus(finishedStatuses...), dbos.WithFilterCompletedBefore(before),
				dbos.WithFilterLimit(size))
		}, remove, size, stop)
		if deleted += n; err != nil {
			return deleted, 0, err
		}
	}
	// A threshold of 0 or less keeps nothing by that rule: it is no rule (v1.6.0 turned it into an error).
	if keep := round.GCRowsThreshold; keep != nil && *keep > 0 {
		n, err := drain(func() ([]string, error) {
			return listIDs(ctx, dbos.WithFilterStatus(finishedStatuses...), dbos.WithFilterSortDesc(),
				dbos.WithFilterOffset(int(*keep)), dbos.WithFilterLimit(size))
		}, remove, size, stop)
		if deleted += n; err != nil {
			return deleted, 0, err
		}
	}
	if round.TimeoutCutoffEpochMS != nil {
		until := time.UnixMilli(*round.TimeoutCutoffEpochMS)
		cancelled, err = drain(func() ([]string, error) {
			return listIDs(ctx, dbos.WithFilterStatus(activeStatuses...), dbos.WithFilterCreatedBefore(until),
				dbos.WithFilterLimit(size))
		}, func(ids []string) error { return dbos.CancelWorkflows(ctx, ids) }, size, stop)
	}
	return deleted, cancelled, err
}

// retention runs rounds, one at a time per process.
type retention struct {
	ctx     dbos.Context
	log     *slog.Logger
	stopped func() bool // the client is closing: the round ends at its next batch

	mu      sync.Mutex
	running bool
	wg      sync.WaitGroup
}

// start starts a round in the background; false (and a warning) when the previous one still runs.
func (r *retention) start(round Round) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped() {
		return false
	}
	if r.running {
		r.log.Warn("Skipping retention: the previous round on this executor is still running.")
		return false
	}
	r.running = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() {
			r.mu.Lock()
			r.running = false
			r.mu.Unlock()
		}()
		deleted, cancelled, err := r.run(round)
		switch {
		case err != nil && r.stopped():
			r.log.Debug("Retention interrupted by shutdown", "error", err)
		case err != nil:
			r.log.Error("Exception encountered during enforcing retention policy", "error", err)
		case deleted > 0 || cancelled > 0:
			r.log.Info("Retention: finished workflows deleted, timed out workflows cancelled",
				"deleted", deleted, "cancelled", cancelled)
		}
	}()
	return true
}

// run is RunRound, a panic in it an error: a retention round never takes the application down.
func (r *retention) run(round Round) (deleted, cancelled int, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			err = fmt.Errorf("panic: %v", recovered)
		}
	}()
	return RunRound(r.ctx, round, r.stopped)
}

// wait waits for the running round, at most timeout; whether it ended.
func (r *retention) wait(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}
