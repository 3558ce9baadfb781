package relay

// The wire shapes of what the SDK hands back: workflows, steps, schedules, queues and versions, with the field names
// of the conductor client built into dbos-transact-golang v1.6.0. Every field is sent, null when it has no value
// (as dbos 3.2.0 sends them; v1.6.0 left them out), so Relay sees one shape from every executor of this client.

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// WorkflowOutput is a workflow as list_workflows replies carry it: PascalCase, every value text (epoch ms as
// digits), WasForkedFrom aside.
type WorkflowOutput struct {
	WorkflowUUID            string  `json:"WorkflowUUID"`
	Status                  *string `json:"Status"`
	WorkflowName            *string `json:"WorkflowName"`
	WorkflowClassName       *string `json:"WorkflowClassName"`
	WorkflowConfigName      *string `json:"WorkflowConfigName"`
	AuthenticatedUser       *string `json:"AuthenticatedUser"`
	AssumedRole             *string `json:"AssumedRole"`
	AuthenticatedRoles      *string `json:"AuthenticatedRoles"`
	Input                   *string `json:"Input"`
	Output                  *string `json:"Output"`
	Error                   *string `json:"Error"`
	CreatedAt               *string `json:"CreatedAt"`
	UpdatedAt               *string `json:"UpdatedAt"`
	QueueName               *string `json:"QueueName"`
	ApplicationVersion      *string `json:"ApplicationVersion"`
	ExecutorID              *string `json:"ExecutorID"`
	WorkflowTimeoutMS       *string `json:"WorkflowTimeoutMS"`
	WorkflowDeadlineEpochMS *string `json:"WorkflowDeadlineEpochMS"`
	DeduplicationID         *string `json:"DeduplicationID"`
	Priority                *string `json:"Priority"`
	QueuePartitionKey       *string `json:"QueuePartitionKey"`
	ForkedFrom              *string `json:"ForkedFrom"`
	WasForkedFrom           bool    `json:"WasForkedFrom"`
	ParentWorkflowID        *string `json:"ParentWorkflowID"`
	DequeuedAt              *string `json:"DequeuedAt"`
	DelayUntilEpochMS       *string `json:"DelayUntilEpochMS"`
	CompletedAt             *string `json:"CompletedAt"`
	Attributes              *string `json:"Attributes"`
	ScheduleName            *string `json:"ScheduleName"`
	ApplicationName         *string `json:"ApplicationName"`
}

// orNull is nil for "" (the SDK's "not set"), else the text.
func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// epochMS is the instant as epoch-millisecond digits, nil for the zero time.
func epochMS(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	return text(strconv.FormatInt(t.UnixMilli(), 10))
}

// valueJSON is a stored value as JSON text: the SDK hands a default-serialized value back as its JSON text, and a
// decoded value (portable, gob, custom) as a Go value, which is marshalled.
func valueJSON(v any) *string {
	if v == nil {
		return nil
	}
	if s, ok := v.(string); ok && json.Valid([]byte(s)) {
		return &s
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return text(string(data))
}

func errorText(err error) *string {
	if err == nil {
		return nil
	}
	return text(err.Error())
}

func workflowOutput(w dbos.WorkflowStatus) WorkflowOutput {
	out := WorkflowOutput{
		WorkflowUUID: w.ID, Status: orNull(string(w.Status)), WorkflowName: orNull(w.Name),
		WorkflowClassName: orNull(w.ClassName), WorkflowConfigName: w.ConfigName,
		AuthenticatedUser: orNull(w.AuthenticatedUser), AssumedRole: orNull(w.AssumedRole),
		Input: valueJSON(w.Input), Output: valueJSON(w.Output), Error: errorText(w.Error),
		CreatedAt: epochMS(w.CreatedAt), UpdatedAt: epochMS(w.UpdatedAt), QueueName: orNull(w.QueueName),
		ApplicationVersion: orNull(w.ApplicationVersion), ExecutorID: orNull(w.ExecutorID),
		WorkflowDeadlineEpochMS: epochMS(w.Deadline), DeduplicationID: orNull(w.DeduplicationID),
		Priority: text(strconv.Itoa(w.Priority)), QueuePartitionKey: orNull(w.QueuePartitionKey),
		ForkedFrom: orNull(w.ForkedFrom), WasForkedFrom: w.WasForkedFrom, ParentWorkflowID: orNull(w.ParentWorkflowID),
		DelayUntilEpochMS: epochMS(w.DelayUntil), CompletedAt: epochMS(w.CompletedAt),
		ScheduleName: orNull(w.ScheduleName), ApplicationName: orNull(w.ApplicationName),
	}
	if len(w.AuthenticatedRoles) > 0 {
		out.AuthenticatedRoles = valueJSON(w.AuthenticatedRoles)
	}
	if w.Timeout > 0 {
		out.WorkflowTimeoutMS = text(strconv.FormatInt(w.Timeout.Milliseconds(), 10))
	}
	// The SDK records when a workflow was dequeued as its start; v1.6.0 reported it for running workflows.
	if w.Status == dbos.WorkflowStatusPending {
		out.DequeuedAt = epochMS(w.StartedAt)
	}
	if len(w.Attributes) > 0 {
		out.Attributes = valueJSON(w.Attributes)
	}
	return out
}

// StepOutput is one step as list_steps replies carry it.
type StepOutput struct {
	FunctionID         int     `json:"function_id"`
	FunctionName       string  `json:"function_name"`
	Output             *string `json:"output"`
	Error              *string `json:"error"`
	ChildWorkflowID    *string `json:"child_workflow_id"`
	StartedAtEpochMS   *string `json:"started_at_epoch_ms"`
	CompletedAtEpochMS *string `json:"completed_at_epoch_ms"`
}

func stepOutput(s dbos.StepInfo) StepOutput {
	if s.Error != nil { // what a failed step returned beside its error is no result (the SDK stores its zero value)
		s.Output = nil
	}
	return StepOutput{
		FunctionID: s.StepID, FunctionName: s.StepName, Output: valueJSON(s.Output), Error: errorText(s.Error),
		ChildWorkflowID: orNull(s.ChildWorkflowID), StartedAtEpochMS: epochMS(s.StartedAt),
		CompletedAtEpochMS: epochMS(s.CompletedAt),
	}
}

// ScheduleOutput is a schedule as list_schedules and get_schedule replies carry it.
type ScheduleOutput struct {
	ScheduleID        string  `json:"schedule_id"`
	ScheduleName      string  `json:"schedule_name"`
	WorkflowName      string  `json:"workflow_name"`
	WorkflowClassName *string `json:"workflow_class_name"`
	Schedule          string  `json:"schedule"`
	Status            string  `json:"status"`
	Context           *string `json:"context"`
	LastFiredAt       *string `json:"last_fired_at"`
	AutomaticBackfill bool    `json:"automatic_backfill"`
	CronTimezone      *string `json:"cron_timezone"`
	QueueName         *string `json:"queue_name"`
	ApplicationName   *string `json:"application_name"`
}

func scheduleOutput(s dbos.WorkflowSchedule, loadContext bool) ScheduleOutput {
	out := ScheduleOutput{
		ScheduleID: s.ScheduleID, ScheduleName: s.ScheduleName, WorkflowName: s.WorkflowName,
		WorkflowClassName: orNull(s.WorkflowClassName), Schedule: s.Schedule, Status: string(s.Status),
		AutomaticBackfill: s.AutomaticBackfill, CronTimezone: orNull(s.CronTimezone), QueueName: orNull(s.QueueName),
		ApplicationName: orNull(s.ApplicationName),
	}
	if s.LastFiredAt != nil {
		out.LastFiredAt = text(s.LastFiredAt.Format(time.RFC3339Nano))
	}
	if loadContext && len(s.Context) > 0 {
		out.Context = text(string(s.Context))
	}
	return out
}

// QueueOutput is a queue as list_queues and get_queue replies carry it: its persisted configuration.
type QueueOutput struct {
	Name                        string   `json:"name"`
	Concurrency                 *int     `json:"concurrency"`
	WorkerConcurrency           *int     `json:"worker_concurrency"`
	RateLimitMax                *int     `json:"rate_limit_max"`
	RateLimitPeriodSec          *float64 `json:"rate_limit_period_sec"`
	PriorityEnabled             bool     `json:"priority_enabled"`
	PartitionQueue              bool     `json:"partition_queue"`
	PollingIntervalSec          float64  `json:"polling_interval_sec"`
	ApplicationName             *string  `json:"application_name"`
	PartitionConcurrency        *int     `json:"partition_concurrency"`
	PartitionWorkerConcurrency  *int     `json:"partition_worker_concurrency"`
	PartitionRateLimitMax       *int     `json:"partition_rate_limit_max"`
	PartitionRateLimitPeriodSec *float64 `json:"partition_rate_limit_period_sec"`
}

func rateLimit(r *dbos.RateLimiter) (*int, *float64) {
	if r == nil {
		return nil, nil
	}
	limit, period := r.Limit, r.Period.Seconds()
	return &limit, &period
}

func queueOutput(q dbos.Queue) QueueOutput {
	c := q.Config() // the persisted columns, not the limits as resolved for a legacy partitioned queue
	out := QueueOutput{
		Name: c.Name, Concurrency: c.GlobalConcurrency, WorkerConcurrency: c.WorkerConcurrency,
		PriorityEnabled: c.PriorityEnabled, PartitionQueue: c.PartitionQueue,
		PollingIntervalSec: q.GetPollingInterval().Seconds(), ApplicationName: orNull(c.ApplicationName),
		PartitionConcurrency: c.PartitionConcurrency, PartitionWorkerConcurrency: c.PartitionWorkerConcurrency,
	}
	out.RateLimitMax, out.RateLimitPeriodSec = rateLimit(c.RateLimit)
	out.PartitionRateLimitMax, out.PartitionRateLimitPeriodSec = rateLimit(c.PartitionRateLimit)
	return out
}

// VersionOutput is an application version as list_application_versions replies carry it.
type VersionOutput struct {
	VersionID        string `json:"version_id"`
	VersionName      string `json:"version_name"`
	VersionTimestamp int64  `json:"version_timestamp"`
	CreatedAt        int64  `json:"created_at"`
}

func versionOutput(v dbos.VersionInfo) VersionOutput {
	return VersionOutput{VersionID: v.ID, VersionName: v.Name, VersionTimestamp: v.Timestamp, CreatedAt: v.CreatedAt}
}
