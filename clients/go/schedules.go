package relay

// Requests about schedules, application versions and queues, each on DBOS's public API.

import (
	"errors"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

func (o *operations) loadContext(r Request) (bool, error) {
	load, err := r.Bool("load_context", true)
	return load && !o.metadataOnly, err
}

func (o *operations) listSchedules(request Request) (Fields, error) {
	b, err := request.Body(false)
	if err != nil {
		return nil, err
	}
	r := &reader{b: b}
	status, names, prefixes, apps := r.list("status"), r.list("workflow_name"), r.list("schedule_name_prefix"),
		r.list("application_name")
	if r.err != nil {
		return nil, r.err
	}
	load, err := o.loadContext(b)
	if err != nil {
		return nil, err
	}
	var opts []dbos.ListSchedulesOption
	if len(status) > 0 {
		values := make([]dbos.ScheduleStatus, len(status))
		for i, s := range status {
			values[i] = dbos.ScheduleStatus(s)
		}
		opts = append(opts, dbos.WithScheduleStatuses(values...))
	}
	if len(names) > 0 {
		opts = append(opts, dbos.WithScheduleWorkflowNames(names...))
	}
	if len(prefixes) > 0 {
		opts = append(opts, dbos.WithScheduleNamePrefixes(prefixes...))
	}
	if len(apps) > 0 {
		opts = append(opts, dbos.WithScheduleApplicationNames(apps...))
	}
	schedules, err := dbos.ListSchedules(o.ctx, opts...)
	if err != nil {
		return nil, err
	}
	out := make([]ScheduleOutput, len(schedules))
	for i, s := range schedules {
		out[i] = scheduleOutput(s, load)
	}
	return Fields{"output": out}, nil
}

func (o *operations) getSchedule(r Request) (Fields, error) {
	name, err := r.Str("schedule_name")
	if err != nil {
		return nil, err
	}
	load, err := o.loadContext(r)
	if err != nil {
		return nil, err
	}
	found, err := dbos.GetSchedule(o.ctx, name)
	if errors.Is(err, dbos.ErrScheduleNotFound) {
		return Fields{"output": nil}, nil
	}
	if err != nil {
		return nil, err
	}
	return Fields{"output": scheduleOutput(found, load)}, nil
}

func (o *operations) pauseSchedule(r Request) (Fields, error) {
	name, err := r.Str("schedule_name")
	if err != nil {
		return nil, err
	}
	if err := dbos.PauseSchedule(o.ctx, name); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}

func (o *operations) resumeSchedule(r Request) (Fields, error) {
	name, err := r.Str("schedule_name")
	if err != nil {
		return nil, err
	}
	if err := dbos.ResumeSchedule(o.ctx, name); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}

func (o *operations) backfillSchedule(r Request) (Fields, error) {
	name, err := r.Str("schedule_name")
	if err != nil {
		return nil, err
	}
	for _, field := range []string{"start", "end"} {
		if _, err := r.Str(field); err != nil {
			return nil, err
		}
	}
	start, err := r.OptTime("start")
	if err != nil {
		return nil, err
	}
	end, err := r.OptTime("end")
	if err != nil {
		return nil, err
	}
	workflowIDs, err := dbos.BackfillSchedule(o.ctx, name, start, end)
	if err != nil {
		return nil, err
	}
	if workflowIDs == nil {
		workflowIDs = []string{}
	}
	return Fields{"workflow_ids": workflowIDs}, nil
}

func (o *operations) triggerSchedule(r Request) (Fields, error) {
	name, err := r.Str("schedule_name")
	if err != nil {
		return nil, err
	}
	handle, err := dbos.TriggerSchedule[any](o.ctx, name)
	if err != nil {
		return nil, err
	}
	return Fields{"workflow_id": handle.GetWorkflowID()}, nil
}

// -- versions and queues ----------------------------------------------------------------------------------------

func (o *operations) listApplicationVersions(Request) (Fields, error) {
	versions, err := dbos.ListApplicationVersions(o.ctx)
	if err != nil {
		return nil, err
	}
	out := make([]VersionOutput, len(versions))
	for i, v := range versions {
		out[i] = versionOutput(v)
	}
	return Fields{"output": out}, nil
}

func (o *operations) setLatestApplicationVersion(r Request) (Fields, error) {
	name, err := r.Str("version_name")
	if err != nil {
		return nil, err
	}
	if err := dbos.SetLatestApplicationVersion(o.ctx, name); err != nil {
		return nil, err
	}
	return Fields{"success": true}, nil
}

func (o *operations) listQueues(request Request) (Fields, error) {
	b, err := request.Body(false)
	if err != nil {
		return nil, err
	}
	apps, err := b.StrOrList("application_name")
	if err != nil {
		return nil, err
	}
	var opts []dbos.ListQueuesOption
	if len(apps) > 0 {
		opts = append(opts, dbos.WithListQueuesApplicationNames(apps...))
	}
	queues, err := dbos.ListQueues(o.ctx, opts...)
	if err != nil {
		return nil, err
	}
	out := make([]QueueOutput, len(queues))
	for i, q := range queues {
		out[i] = queueOutput(q)
	}
	return Fields{"output": out}, nil
}

func (o *operations) getQueue(r Request) (Fields, error) {
	name, err := r.Str("name")
	if err != nil {
		return nil, err
	}
	found, err := dbos.RetrieveQueue(o.ctx, name)
	if errors.Is(err, dbos.ErrQueueNotFound) || (err == nil && found == nil) {
		return Fields{"output": nil}, nil
	}
	if err != nil {
		return nil, err
	}
	return Fields{"output": queueOutput(found)}, nil
}
