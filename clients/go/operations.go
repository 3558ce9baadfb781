package relay

// Every request type Relay sends, answered on DBOS's public API, with the reply fields of the conductor client
// built into dbos-transact-golang v1.6.0.
//
// How each is answered on v1.9 (the closing table of the client's README says the same):
//
//   - public calls: list_workflows, list_queued_workflows, get_workflow, exist_pending_workflows, list_steps,
//     cancel, resume, delete, fork_workflow, rewind_workflow, get_workflow_aggregates, get_step_aggregates,
//     list_schedules, get_schedule, pause_schedule, resume_schedule, backfill_schedule, trigger_schedule,
//     list_application_versions, set_latest_application_version, list_queues, get_queue; executor_info and alert
//     need no SDK call beyond the context's accessors;
//   - the one call outside the public API, recovery (recovery.go);
//   - this client's own, on public calls: retention (retention.go) and fork_from_failure (the start steps read
//     with GetWorkflowSteps, then one ForkWorkflows);
//   - unsupported (*Unsupported, which Relay answers with 501): get_metrics, export_workflow, import_workflow,
//     get_workflow_events, get_workflow_notifications, get_workflow_streams: v1.7 moved them to the commercial
//     add-on, and no public call lists a workflow's events, notifications or streams.

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// AlertHandler takes the alerts Relay sends.
type AlertHandler func(name, message string, metadata map[string]string)

// operations are the answers of one executor process.
type operations struct {
	ctx          dbos.Context
	metadata     map[string]any // sent in executor_info
	onAlert      AlertHandler   // nil: alerts are logged
	metadataOnly bool           // inputs, outputs, errors and schedule contexts withheld
	retention    *retention
	sdkVersion   string
	log          *slog.Logger
}

func (o *operations) table() map[string]Operation {
	ok := Fields{"success": false}
	none := Fields{"output": nil}
	empty := Fields{"output": []any{}}
	op := func(h Handler, failed Fields, context string) Operation {
		return Operation{Handler: h, Failed: failed, Context: "Exception encountered when " + context}
	}
	return map[string]Operation{
		"executor_info":              op(o.executorInfo, Fields{}, "describing the executor"),
		"recovery":                   op(o.recovery, ok, "recovering workflows"),
		"exist_pending_workflows":    op(o.existPendingWorkflows, Fields{"exist": false}, "checking for pending workflows"),
		"retention":                  op(o.retentionRound, ok, "starting retention"),
		"list_workflows":             op(o.listWorkflows, empty, "listing workflows"),
		"list_queued_workflows":      op(o.listQueuedWorkflows, empty, "listing queued workflows"),
		"get_workflow":               op(o.getWorkflow, none, "getting a workflow"),
		"list_steps":                 op(o.listSteps, none, "listing steps"),
		"cancel":                     op(o.cancel, ok, "cancelling workflow(s)"),
		"resume":                     op(o.resume, ok, "resuming workflow(s)"),
		"delete":                     op(o.delete, ok, "deleting workflow(s)"),
		"fork_workflow":              op(o.forkWorkflow, Fields{"new_workflow_id": nil}, "forking a workflow"),
		"fork_from_failure":          op(o.forkFromFailure, Fields{"forked_workflow_ids": nil}, "bulk forking workflows"),
		"rewind_workflow":            op(o.rewindWorkflow, ok, "rewinding workflow"),
		"get_metrics":                op(o.moved("get_metrics"), Fields{"metrics": []any{}}, "getting metrics"),
		"alert":                      op(o.alert, ok, "processing alert"),
		"export_workflow":            op(o.moved("export_workflow"), Fields{"serialized_workflow": nil}, "exporting a workflow"),
		"import_workflow":            op(o.moved("import_workflow"), ok, "importing a workflow"),
		"list_schedules":             op(o.listSchedules, empty, "listing schedules"),
		"get_schedule":               op(o.getSchedule, none, "getting a schedule"),
		"pause_schedule":             op(o.pauseSchedule, ok, "pausing a schedule"),
		"resume_schedule":            op(o.resumeSchedule, ok, "resuming a schedule"),
		"backfill_schedule":          op(o.backfillSchedule, Fields{"workflow_ids": []string{}}, "backfilling a schedule"),
		"trigger_schedule":           op(o.triggerSchedule, Fields{"workflow_id": nil}, "triggering a schedule"),
		"get_workflow_events":        op(o.moved("get_workflow_events"), Fields{"events": nil}, "getting a workflow's events"),
		"get_workflow_notifications": op(o.moved("get_workflow_notifications"), Fields{"notifications": nil}, "getting a workflow's notifications"),
		"get_workflow_streams":       op(o.moved("get_workflow_streams"), Fields{"streams": nil}, "getting a workflow's streams"),
		"get_workflow_aggregates":    op(o.workflowAggregates, empty, "getting workflow aggregates"),
		"get_step_aggregates":        op(o.stepAggregates, empty, "getting step aggregates"),
		"list_application_versions":  op(o.listApplicationVersions, empty, "listing application versions"),
		"set_latest_application_version": op(o.setLatestApplicationVersion, ok,
			"setting the latest application version"),
		"list_queues": op(o.listQueues, empty, "listing queues"),
		"get_queue":   op(o.getQueue, none, "getting a queue"),
	}
}

// -- the executor and its recovery ------------------------------------------------------------------------------

func (o *operations) executorInfo(Request) (Fields, error) {
	var hostname *string
	if name, err := os.Hostname(); err == nil {
		hostname = &name
	}
	return Fields{
		"executor_id": o.ctx.GetExecutorID(), "application_version": o.ctx.GetApplicationVersion(),
		"hostname": hostname, "language": "go", "dbos_version": o.sdkVersion, "executor_metadata": o.metadata,
	}, nil
}

func (o *operations) recovery(r Request) (Fields, error) {
	if !r.has("executor_ids") {
		return nil, r.bad("field 'executor_ids' is required")
	}
	ids, err := r.Strs("executor_ids")
	if err != nil {
		return nil, err
	}
	count, err := recoverPending(o.ctx, ids)
	if err != nil {
		return nil, err
	}
	o.log.Info("relay-dbos: recovered pending workflows", "executor_ids", ids, "count", count)
	return Fields{"success": true}, nil
}

func (o *operations) existPendingWorkflows(r Request) (Fields, error) {
	executorID, err := r.Str("executor_id")
	if err != nil {
		return nil, err
	}
	version, err := r.Str("application_version")
	if err != nil {
		return nil, err
	}
	// The query recovery itself makes: PENDING, owned by that executor, of that version.
	found, err := dbos.ListWorkflows(o.ctx, dbos.WithFilterStatus(dbos.WorkflowStatusPending),
		dbos.WithFilterExecutorIDs(executorID), dbos.WithFilterAppVersion(version), dbos.WithFilterLimit(1),
		dbos.WithFilterLoadInput(false), dbos.WithFilterLoadOutput(false))
	if err != nil {
		return nil, err
	}
	return Fields{"exist": len(found) > 0}, nil
}

func (o *operations) retentionRound(r Request) (Fields, error) {
	b, err := r.Body(true)
	if err != nil {
		return nil, err
	}
	var round Round
	for name, into := range map[string]**int64{
		"gc_cutoff_epoch_ms": &round.GCCutoffEpochMS, "gc_rows_threshold": &round.GCRowsThreshold,
		"gc_batch_size": &round.GCBatchSize, "timeout_cutoff_epoch_ms": &round.TimeoutCutoffEpochMS,
	} {
		if *into, err = b.OptInt(name); err != nil {
			return nil, err
		}
	}
	o.retention.start(round)
	return Fields{"success": true}, nil // started, not finished: as v1.6.0 and dbos 3.2.0 answer
}

func (o *operations) alert(r Request) (Fields, error) {
	name, err := r.Str("name")
	if err != nil {
		return nil, err
	}
	message, err := r.Str("message")
	if err != nil {
		return nil, err
	}
	raw, err := r.Object("metadata")
	if err != nil {
		return nil, err
	}
	metadata := make(map[string]string, len(raw))
	for key, value := range raw {
		if s, ok := value.(string); ok {
			metadata[key] = s
		} else {
			metadata[key] = fmt.Sprint(value)
		}
	}
	if o.onAlert != nil {
		o.onAlert(name, message, metadata)
	} else {
		o.log.Info("Alert received", "name", name, "message", message, "metadata", metadata)
	}
	return Fields{"success": true}, nil
}

// -- what this SDK release cannot do ----------------------------------------------------------------------------

func (o *operations) moved(operation string) Handler {
	return func(Request) (Fields, error) {
		return nil, &Unsupported{Message: fmt.Sprintf("%s is not available with dbos-transact-golang %s: DBOS moved "+
			"it out of its MIT-licensed module in v1.7, and relay-dbos-go has no public call to do it with",
			operation, o.sdkVersion)}
	}
}
