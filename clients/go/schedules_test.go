package relay

// Schedules through the protocol, on a real DBOS v1.9.0.

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

func TestSchedulesWhenThereAreNone(t *testing.T) {
	a := newAsker(t, false, nil)
	if out := list(t, a.ok("list_schedules", m{"body": m{"schedule_name_prefix": "none-such-"}})["output"]); len(out) != 0 {
		t.Fatalf("schedules %v", out)
	}
	if out := a.ok("get_schedule", m{"schedule_name": "none-such"})["output"]; out != nil {
		t.Fatalf("schedule %v", out)
	}
}

func TestSchedules(t *testing.T) {
	a := newAsker(t, false, nil)
	name := "nightly-" + uuid4()
	if err := dbos.CreateSchedule(env.ctx, dbos.ScheduleSpec{ScheduleName: name, Schedule: "0 0 0 * * *",
		Workflow: tick, Context: m{"region": "eu"}}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dbos.DeleteSchedule(env.ctx, name) }()

	listed := list(t, a.ok("list_schedules", m{"body": m{"schedule_name_prefix": name}})["output"])
	if len(listed) != 1 {
		t.Fatalf("schedules %v", listed)
	}
	s := listed[0]
	if s["schedule_name"] != name || s["workflow_name"] != "tick" || s["schedule"] != "0 0 0 * * *" ||
		s["status"] != "ACTIVE" || !strings.Contains(s["context"].(string), "eu") {
		t.Fatalf("schedule %v", s)
	}
	same := func(a, b any) bool {
		x, _ := json.Marshal(a)
		y, _ := json.Marshal(b)
		return string(x) == string(y)
	}
	if got := a.ok("get_schedule", m{"schedule_name": name})["output"]; !same(got, s) {
		t.Fatalf("get_schedule %v, list_schedules %v", got, s)
	}
	if got := a.ok("get_schedule", m{"schedule_name": name, "load_context": false})["output"].(m); got["context"] != nil {
		t.Fatalf("context %v", got["context"])
	}
	if got := newAsker(t, true, nil).ok("get_schedule", m{"schedule_name": name})["output"].(m); got["context"] != nil {
		t.Fatalf("context in metadata-only mode %v", got["context"])
	}

	a.ok("pause_schedule", m{"schedule_name": name})
	if got := a.ok("get_schedule", m{"schedule_name": name})["output"].(m); got["status"] != "PAUSED" {
		t.Fatalf("paused %v", got)
	}
	if out := list(t, a.ok("list_schedules", m{"body": m{"schedule_name_prefix": name, "status": "ACTIVE"}})["output"]); len(out) != 0 {
		t.Fatalf("active %v", out)
	}
	a.ok("resume_schedule", m{"schedule_name": name})
	if got := a.ok("get_schedule", m{"schedule_name": name})["output"].(m); got["status"] != "ACTIVE" {
		t.Fatalf("resumed %v", got)
	}

	triggered := a.ok("trigger_schedule", m{"schedule_name": name})["workflow_id"].(string)
	if w := finished(t, triggered, dbos.WorkflowStatusSuccess); w.Name != "tick" {
		t.Fatalf("triggered %s", w.Name)
	}
	backfilled := a.ok("backfill_schedule", m{"schedule_name": name, "start": "2026-01-01T00:00:00Z",
		"end": "2026-01-03T12:00:00Z"})["workflow_ids"].([]any)
	var fired []string
	for _, id := range backfilled {
		at, err := dbos.GetEvent[string](env.ctx, id.(string), "scheduled_at", 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		fired = append(fired, at)
	}
	slices.Sort(fired)
	if !slices.Equal(fired, []string{"2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"}) {
		t.Fatalf("backfilled %v", fired)
	}
	if got := list(t, a.ok("list_schedules", m{"body": m{"workflow_name": "tick", "schedule_name_prefix": name}})["output"]); len(got) != 1 {
		t.Fatalf("by workflow %v", got)
	}
}

func TestTriggeringAMissingScheduleFails(t *testing.T) {
	reply := newAsker(t, false, nil).ask("trigger_schedule", m{"schedule_name": "none-such"})
	if reply["workflow_id"] != nil ||
		!strings.HasPrefix(reply["error_message"].(string), "Exception encountered when triggering a schedule: ") {
		t.Fatalf("reply %v", reply)
	}
}
