package relay

// Requests about workflows: lists, steps, bulk actions, forks and aggregates, each on DBOS's public API.

import (
	"fmt"
	"math"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// filters reads a list_workflows body into ListWorkflows options.
type filters struct {
	b    Request
	opts []dbos.ListWorkflowsOption
	err  error
}

// list adds the option of a string-or-list filter when it is given.
func (f *filters) list(name string, option func(...string) dbos.ListWorkflowsOption) {
	if f.err != nil {
		return
	}
	var values []string
	if values, f.err = f.b.StrOrList(name); len(values) > 0 {
		f.opts = append(f.opts, option(values...))
	}
}

func (f *filters) time(name string, option func(time.Time) dbos.ListWorkflowsOption) {
	if f.err != nil {
		return
	}
	var t time.Time
	if t, f.err = f.b.OptTime(name); !t.IsZero() {
		f.opts = append(f.opts, option(t))
	}
}

func (f *filters) flag(name string, option func(bool) dbos.ListWorkflowsOption) {
	if f.err != nil {
		return
	}
	var b *bool
	if b, f.err = f.b.OptBool(name); b != nil {
		f.opts = append(f.opts, option(*b))
	}
}

func (f *filters) number(name string, option func(int) dbos.ListWorkflowsOption) {
	if f.err != nil {
		return
	}
	var n *int64
	if n, f.err = f.b.OptInt(name); n != nil {
		f.opts = append(f.opts, option(int(*n)))
	}
}

func statuses(values []string) []dbos.WorkflowStatusType {
	out := make([]dbos.WorkflowStatusType, len(values))
	for i, s := range values {
		out[i] = dbos.WorkflowStatusType(s)
	}
	return out
}

func (o *operations) listed(r Request, queuesOnly bool) ([]dbos.WorkflowStatus, error) {
	b, err := r.Body(true)
	if err != nil {
		return nil, err
	}
	f := &filters{b: b}
	if ids, err := b.Strs("workflow_uuids"); err != nil {
		return nil, err
	} else if len(ids) > 0 {
		f.opts = append(f.opts, dbos.WithFilterWorkflowIDs(ids...))
	}
	f.list("workflow_name", dbos.WithFilterName)
	f.list("authenticated_user", dbos.WithFilterUser)
	f.list("application_version", dbos.WithFilterAppVersion)
	f.list("application_name", dbos.WithFilterApplicationName)
	f.list("forked_from", dbos.WithFilterForkedFrom)
	f.list("parent_workflow_id", dbos.WithFilterParentWorkflowID)
	f.list("queue_name", dbos.WithFilterQueueName)
	f.list("workflow_id_prefix", dbos.WithFilterWorkflowIDPrefix)
	f.list("executor_id", dbos.WithFilterExecutorIDs)
	f.list("schedule_name", dbos.WithFilterScheduleName)
	f.list("status", func(s ...string) dbos.ListWorkflowsOption { return dbos.WithFilterStatus(statuses(s)...) })
	f.time("start_time", dbos.WithFilterCreatedAfter)
	f.time("end_time", dbos.WithFilterCreatedBefore)
	f.time("completed_after", dbos.WithFilterCompletedAfter)
	f.time("completed_before", dbos.WithFilterCompletedBefore)
	f.time("dequeued_after", dbos.WithFilterDequeuedAfter)
	f.time("dequeued_before", dbos.WithFilterDequeuedBefore)
	f.flag("was_forked_from", dbos.WithFilterWasForkedFrom)
	f.flag("is_fork", dbos.WithFilterIsFork)
	f.flag("has_parent", dbos.WithFilterHasParent)
	f.number("limit", dbos.WithFilterLimit)
	f.number("offset", dbos.WithFilterOffset)
	if f.err != nil {
		return nil, f.err
	}
	attributes, err := b.Object("attributes")
	if err != nil {
		return nil, err
	}
	if len(attributes) > 0 {
		f.opts = append(f.opts, dbos.WithFilterAttributes(attributes))
	}
	sortDesc, err := b.Bool("sort_desc", false)
	if err != nil {
		return nil, err
	}
	if sortDesc {
		f.opts = append(f.opts, dbos.WithFilterSortDesc())
	}
	onlyQueues, err := b.Bool("queues_only", false)
	if err != nil {
		return nil, err
	}
	if queuesOnly || onlyQueues {
		f.opts = append(f.opts, dbos.WithFilterQueuesOnly())
	}
	loadInput, err := b.Bool("load_input", true)
	if err != nil {
		return nil, err
	}
	loadOutput, err := b.Bool("load_output", true)
	if err != nil {
		return nil, err
	}
	f.opts = append(f.opts, dbos.WithFilterLoadInput(loadInput && !o.metadataOnly),
		dbos.WithFilterLoadOutput(loadOutput && !o.metadataOnly))
	found, err := dbos.ListWorkflows(o.ctx, f.opts...)
	if err != nil {
		return nil, err
	}
	if o.metadataOnly { // the error is data too
		for i := range found {
			found[i].Error = nil
		}
	}
	return found, nil
}

func (o *operations) workflowList(r Request, queuesOnly bool) (Fields, error) {
	found, err := o.listed(r, queuesOnly)
	if err != nil {
		return nil, err
	}
	out := make([]WorkflowOutput, len(found))
	for i, w := range found {
		out[i] = workflowOutput(w)
	}
	return Fields{"output": out}, nil
}

func (o *operations) listWorkflows(r Request) (Fields, error) { return o.workflowList(r, false) }

func (o *operations) listQueuedWorkflows(r Request) (Fields, error) { return o.workflowList(r, true) }

func (o *operations) getWorkflow(r Request) (Fields, error) {
	id, err := r.Str("workflow_id")
	if err != nil {
		return nil, err
	}
	loadInput, err := r.Bool("load_input", true)
	if err != nil {
		return nil, err
	}
	loadOutput, err := r.Bool("load_output", true)
	if err != nil {
		return nil, err
	}
	found, err := dbos.ListWorkflows(o.ctx, dbos.WithFilterWorkflowIDs(id),
		dbos.WithFilterLoadInput(loadInput && !o.metadataOnly), dbos.WithFilterLoadOutput(loadOutput && !o.metadataOnly))
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return Fields{"output": nil}, nil
	}
	if o.metadataOnly {
		found[0].Error = nil
	}
	return Fields{"output": workflowOutput(found[0])}, nil
}

func (o *operations) listSteps(r Request) (Fields, error) {
	id, err := r.Str("workflow_id")
	if err != nil {
		return nil, err
	}
	loadOutput, err := r.Bool("load_output", true)
	if err != nil {
		return nil, err
	}
	opts := []dbos.GetWorkflowStepsOption{dbos.WithStepsLoadOutput(loadOutput && !o.metadataOnly)}
	for name, option := range map[string]func(int) dbos.GetWorkflowStepsOption{
		"limit": dbos.WithStepsLimit, "offset": dbos.WithStepsOffset,
	} {
		n, err := r.OptInt(name)
		if err != nil {
			return nil, err
		}
		if n != nil {
			opts = append(opts, option(int(*n)))
		}
	}
	steps, err := dbos.GetWorkflowSteps(o.ctx, id, opts...)
	if err != nil {
		return nil, err
	}
	out := make([]StepOutput, len(steps))
	for i, s := range steps {
		if o.metadataOnly {
			s.Output, s.Error = nil, nil
		}
		out[i] = stepOutput(s)
	}
	return Fields{"output": out}, nil
}

// ids is workflow_ids when given (a bulk action), else the one workflow_id.
func ids(r Request) ([]string, error) {
	list, err := r.Strs("workflow_ids")
	if err != nil || len(list) > 0 {
		return list, err
	}
	id, err := r.Str("workflow_id")
	if err != nil {
		return nil, err
	}
	return []string{id}, nil
}

func (o *operations) cancel(r Request) (Fields, error) {
	workflowIDs, err := ids(r)
	if err != nil {
		return nil, err
	}
	var opts []dbos.CancelWorkflowOption
	if children, err := r.Bool("cancel_children", false); err != nil {
		return nil, err
	} else if children {
		opts = append(opts, dbos.WithCancelChildren())
	}
	if err := dbos.CancelWorkflows(o.ctx, workflowIDs, opts...); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}

func (o *operations) resume(r Request) (Fields, error) {
	workflowIDs, err := ids(r)
	if err != nil {
		return nil, err
	}
	queue, err := r.OptStr("queue_name")
	if err != nil {
		return nil, err
	}
	var opts []dbos.ResumeWorkflowOption
	if queue != "" {
		opts = append(opts, dbos.WithResumeQueue(queue))
	}
	if _, err := dbos.ResumeWorkflows[any](o.ctx, workflowIDs, opts...); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}

func (o *operations) delete(r Request) (Fields, error) {
	workflowIDs, err := ids(r)
	if err != nil {
		return nil, err
	}
	var opts []dbos.DeleteWorkflowOption
	if children, err := r.Bool("delete_children", false); err != nil {
		return nil, err
	} else if children {
		opts = append(opts, dbos.WithDeleteChildren())
	}
	if err := dbos.DeleteWorkflows(o.ctx, workflowIDs, opts...); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}

// step is a start step as the SDK takes it.
func step(r Request, n int64) (uint, error) {
	if n < 0 || n > math.MaxInt32 {
		return 0, r.bad("a start step must be between 0 and %d, not %d", math.MaxInt32, n)
	}
	return uint(n), nil
}

// forkPlacement reads the version and queue a fork runs on.
func forkPlacement(b Request) (version, queue, partition string, err error) {
	if version, err = b.OptStr("application_version"); err != nil {
		return
	}
	if queue, err = b.OptStr("queue_name"); err != nil {
		return
	}
	partition, err = b.OptStr("queue_partition_key")
	return
}

func (o *operations) forkWorkflow(r Request) (Fields, error) {
	b, err := r.Body(true)
	if err != nil {
		return nil, err
	}
	original, err := b.Str("workflow_id")
	if err != nil {
		return nil, err
	}
	n, err := b.Int("start_step")
	if err != nil {
		return nil, err
	}
	start, err := step(b, n)
	if err != nil {
		return nil, err
	}
	newID, err := b.OptStr("new_workflow_id")
	if err != nil {
		return nil, err
	}
	version, queue, partition, err := forkPlacement(b)
	if err != nil {
		return nil, err
	}
	handle, err := dbos.ForkWorkflow[any](o.ctx, dbos.ForkWorkflowInput{
		OriginalWorkflowID: original, ForkedWorkflowID: newID, StartStep: start,
		ApplicationVersion: version, QueueName: queue, QueuePartitionKey: partition,
	})
	if err != nil {
		return nil, err
	}
	return Fields{"new_workflow_id": handle.GetWorkflowID()}, nil
}

// forkFromFailure forks each workflow from one of its steps, chosen as v1.6.0 chose it: from_step as given; the
// last step that failed, else the last step (from_last_failure); the last step (from_last_step); the last step of
// that name (from_step_name). A workflow with no such step is an error, and then nothing is forked: the forks are
// one ForkWorkflows call.
func (o *operations) forkFromFailure(r Request) (Fields, error) {
	b, err := r.Body(true)
	if err != nil {
		return nil, err
	}
	if !b.has("workflow_ids") {
		return nil, b.bad("field 'workflow_ids' is required")
	}
	originals, err := b.Strs("workflow_ids")
	if err != nil {
		return nil, err
	}
	lastFailure, err := b.Bool("from_last_failure", false)
	if err != nil {
		return nil, err
	}
	lastStep, err := b.Bool("from_last_step", false)
	if err != nil {
		return nil, err
	}
	fromStep, err := b.OptInt("from_step")
	if err != nil {
		return nil, err
	}
	name, err := b.OptStr("from_step_name")
	if err != nil {
		return nil, err
	}
	modes := 0
	for _, set := range []bool{lastFailure, lastStep, fromStep != nil, b.has("from_step_name")} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return nil, b.bad("exactly one of from_last_failure, from_last_step, from_step, from_step_name")
	}
	version, queue, partition, err := forkPlacement(b)
	if err != nil {
		return nil, err
	}
	if len(originals) == 0 {
		return Fields{"forked_workflow_ids": []string{}}, nil
	}
	specs := make([]dbos.ForkWorkflowSpec, len(originals))
	for i, original := range originals {
		var start int64
		if fromStep != nil {
			start = *fromStep
		} else if start, err = o.startStep(original, lastFailure, name); err != nil {
			return nil, err
		}
		n, err := step(b, start)
		if err != nil {
			return nil, err
		}
		specs[i] = dbos.ForkWorkflowSpec{OriginalWorkflowID: original, StartStep: n}
	}
	handles, err := dbos.ForkWorkflows[any](o.ctx, dbos.ForkWorkflowsInput{
		Workflows: specs, ApplicationVersion: version, QueueName: queue, QueuePartitionKey: partition,
	})
	if err != nil {
		return nil, err
	}
	forked := make([]string, len(handles))
	for i, h := range handles {
		forked[i] = h.GetWorkflowID()
	}
	return Fields{"forked_workflow_ids": forked}, nil
}

func (o *operations) startStep(workflowID string, lastFailure bool, name string) (int64, error) {
	steps, err := dbos.GetWorkflowSteps(o.ctx, workflowID, dbos.WithStepsLoadOutput(false))
	if err != nil {
		return 0, err
	}
	last, failed := int64(-1), int64(-1)
	for _, s := range steps {
		if name != "" && s.StepName != name {
			continue
		}
		last = max(last, int64(s.StepID))
		if s.Error != nil {
			failed = max(failed, int64(s.StepID))
		}
	}
	switch {
	case last < 0 && name != "":
		return 0, fmt.Errorf("workflow %s has no step named '%s'", workflowID, name)
	case last < 0:
		return 0, fmt.Errorf("workflow %s has no steps", workflowID)
	case lastFailure && failed >= 0:
		return failed, nil
	}
	return last, nil
}

func (o *operations) rewindWorkflow(r Request) (Fields, error) {
	b, err := r.Body(true)
	if err != nil {
		return nil, err
	}
	id, err := b.Str("workflow_id")
	if err != nil {
		return nil, err
	}
	var opts []dbos.RewindWorkflowOption
	if n, err := b.OptInt("start_step"); err != nil {
		return nil, err
	} else if n != nil {
		start, err := step(b, *n)
		if err != nil {
			return nil, err
		}
		opts = append(opts, dbos.WithRewindStartStep(start))
	}
	version, queue, partition, err := forkPlacement(b)
	if err != nil {
		return nil, err
	}
	if version != "" {
		opts = append(opts, dbos.WithRewindApplicationVersion(version))
	}
	if queue != "" {
		opts = append(opts, dbos.WithRewindQueue(queue))
	}
	if partition != "" {
		opts = append(opts, dbos.WithRewindQueuePartitionKey(partition))
	}
	if _, err := dbos.RewindWorkflow[any](o.ctx, id, opts...); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}
