package relay

// get_workflow_aggregates and get_step_aggregates: public calls in v1.9 (GetWorkflowAggregates,
// GetStepAggregates), whose rows already carry the wire's field names.

import (
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// reader reads a request body's fields, keeping the first error.
type reader struct {
	b   Request
	err error
}

func (r *reader) flag(name string) bool {
	if r.err != nil {
		return false
	}
	var v bool
	v, r.err = r.b.Bool(name, false)
	return v
}

func (r *reader) optFlag(name string) *bool {
	if r.err != nil {
		return nil
	}
	var v *bool
	v, r.err = r.b.OptBool(name)
	return v
}

func (r *reader) list(name string) []string {
	if r.err != nil {
		return nil
	}
	var v []string
	v, r.err = r.b.StrOrList(name)
	return v
}

func (r *reader) time(name string) time.Time {
	if r.err != nil {
		return time.Time{}
	}
	var v time.Time
	v, r.err = r.b.OptTime(name)
	return v
}

// bucket is time_bucket_size_ms as a duration: zero when absent, an error when not positive.
func (r *reader) bucket() time.Duration {
	if r.err != nil {
		return 0
	}
	var ms *int64
	if ms, r.err = r.b.OptInt("time_bucket_size_ms"); r.err != nil || ms == nil {
		return 0
	}
	if *ms <= 0 {
		r.err = r.b.bad("time_bucket_size_ms must be > 0")
		return 0
	}
	return time.Duration(*ms) * time.Millisecond
}

func (o *operations) workflowAggregates(request Request) (Fields, error) {
	b, err := request.Body(true)
	if err != nil {
		return nil, err
	}
	r := &reader{b: b}
	in := dbos.GetWorkflowAggregatesInput{
		GroupByStatus: r.flag("group_by_status"), GroupByName: r.flag("group_by_name"),
		GroupByQueueName: r.flag("group_by_queue_name"), GroupByExecutorID: r.flag("group_by_executor_id"),
		GroupByApplicationVersion: r.flag("group_by_application_version"),
		GroupByApplicationName:    r.flag("group_by_application_name"),
		SelectCount:               r.flag("select_count"), SelectMinCreatedAt: r.flag("select_min_created_at"),
		SelectMaxQueueWaitMs:    r.flag("select_max_queue_wait_ms"),
		SelectMaxTotalLatencyMs: r.flag("select_max_total_latency_ms"),
		TimeBucketSize:          r.bucket(),
		Status:                  statuses(r.list("status")),
		StartTime:               r.time("start_time"), EndTime: r.time("end_time"),
		CompletedAfter: r.time("completed_after"), CompletedBefore: r.time("completed_before"),
		DequeuedAfter: r.time("dequeued_after"), DequeuedBefore: r.time("dequeued_before"),
		Name: r.list("name"), ApplicationVersion: r.list("app_version"), ExecutorID: r.list("executor_id"),
		QueueName: r.list("queue_name"), WorkflowIDPrefix: r.list("workflow_id_prefix"),
		WorkflowIDs: r.list("workflow_ids"), AuthenticatedUser: r.list("user"), ForkedFrom: r.list("forked_from"),
		ParentWorkflowID: r.list("parent_workflow_id"), ApplicationName: r.list("application_name"),
		WasForkedFrom: r.optFlag("was_forked_from"), IsFork: r.optFlag("is_fork"), HasParent: r.optFlag("has_parent"),
	}
	if r.err != nil {
		return nil, r.err
	}
	if in.Attributes, err = b.Object("attributes"); err != nil {
		return nil, err
	}
	if len(in.Status) == 0 {
		in.Status = nil
	}
	// As v1.6.0: a request that selects nothing counts.
	if !in.SelectCount && !in.SelectMinCreatedAt && !in.SelectMaxQueueWaitMs && !in.SelectMaxTotalLatencyMs {
		in.SelectCount = true
	}
	rows, err := dbos.GetWorkflowAggregates(o.ctx, in)
	if err != nil {
		return nil, err
	}
	if rows == nil {
		rows = []dbos.WorkflowAggregateRow{}
	}
	return Fields{"output": rows}, nil
}

func (o *operations) stepAggregates(request Request) (Fields, error) {
	b, err := request.Body(true)
	if err != nil {
		return nil, err
	}
	r := &reader{b: b}
	in := dbos.GetStepAggregatesInput{
		GroupByFunctionName: r.flag("group_by_function_name"), GroupByStatus: r.flag("group_by_status"),
		SelectCount: r.flag("select_count"), SelectMaxDurationMs: r.flag("select_max_duration_ms"),
		TimeBucketSize: r.bucket(),
		Status:         r.list("status"), FunctionName: r.list("function_name"),
		WorkflowIDPrefix: r.list("workflow_id_prefix"), CompletedAfter: r.time("completed_after"),
		CompletedBefore: r.time("completed_before"), ApplicationName: r.list("application_name"),
	}
	if r.err != nil {
		return nil, r.err
	}
	if !in.SelectCount && !in.SelectMaxDurationMs {
		in.SelectCount = true
	}
	rows, err := dbos.GetStepAggregates(o.ctx, in)
	if err != nil {
		return nil, err
	}
	if rows == nil {
		rows = []dbos.StepAggregateRow{}
	}
	return Fields{"output": rows}, nil
}
