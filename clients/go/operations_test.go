package relay

// Requests answered by Handle with the real operations table, on a real DBOS v1.9.0 (app_test.go).

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

var allTypes = []string{
	"executor_info", "recovery", "exist_pending_workflows", "retention", "list_workflows", "list_queued_workflows",
	"get_workflow", "list_steps", "cancel", "resume", "delete", "fork_workflow", "fork_from_failure",
	"rewind_workflow", "get_metrics", "alert", "export_workflow", "import_workflow", "list_schedules",
	"get_schedule", "pause_schedule", "resume_schedule", "backfill_schedule", "trigger_schedule",
	"get_workflow_events", "get_workflow_notifications", "get_workflow_streams", "get_workflow_aggregates",
	"get_step_aggregates", "list_application_versions", "set_latest_application_version", "list_queues",
	"get_queue",
}

var unsupportedTypes = []string{"get_metrics", "export_workflow", "import_workflow", "get_workflow_events",
	"get_workflow_notifications", "get_workflow_streams"}

var workflowFields = []string{
	"WorkflowUUID", "Status", "WorkflowName", "WorkflowClassName", "WorkflowConfigName", "AuthenticatedUser",
	"AssumedRole", "AuthenticatedRoles", "Input", "Output", "Error", "CreatedAt", "UpdatedAt", "QueueName",
	"ApplicationVersion", "ExecutorID", "WorkflowTimeoutMS", "WorkflowDeadlineEpochMS", "DeduplicationID",
	"Priority", "QueuePartitionKey", "ForkedFrom", "WasForkedFrom", "ParentWorkflowID", "DequeuedAt",
	"DelayUntilEpochMS", "CompletedAt", "Attributes", "ScheduleName", "ApplicationName",
}

func keys(v m) []string {
	out := make([]string, 0, len(v))
	for k := range v {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}

func isDigits(v any) bool {
	s, ok := v.(string)
	return ok && s != "" && strings.Trim(s, "0123456789") == ""
}

// failedFieldsMatch checks a failed reply carries its type's fields as a failed request has them.
func failedFieldsMatch(t *testing.T, a *asker, kind string, reply m) {
	t.Helper()
	want, err := json.Marshal(a.table[kind].Failed)
	if err != nil {
		t.Fatal(err)
	}
	var failed m
	_ = json.Unmarshal(want, &failed)
	for name, value := range failed {
		got, _ := json.Marshal(reply[name])
		exp, _ := json.Marshal(value)
		if string(got) != string(exp) {
			t.Errorf("%s: failed reply's %s is %s, want %s", kind, name, got, exp)
		}
	}
}

func TestTheTableAnswersThe33RequestTypes(t *testing.T) {
	a := newAsker(t, false, nil)
	var got []string
	for kind := range a.table {
		got = append(got, kind)
	}
	if !slices.Equal(sorted(got), sorted(allTypes)) || len(got) != 33 {
		t.Fatalf("table has %v", sorted(got))
	}
}

func TestEveryTypeAnswersWithItsTypeRequestIDAndErrorMessage(t *testing.T) {
	a := newAsker(t, false, nil)
	for _, kind := range allTypes {
		reply := a.ask(kind, nil) // no field but the two: answered, whether it can be acted on or not
		if message := reply["error_message"]; message != nil {
			if s, ok := message.(string); !ok || s == "" {
				t.Errorf("%s: error_message %#v", kind, message)
			}
			failedFieldsMatch(t, a, kind, reply)
		}
	}
}

func TestExecutorInfo(t *testing.T) {
	reply := newAsker(t, false, m{"zone": "test-a", "rack": 7}).ok("executor_info", nil)
	hostname, _ := os.Hostname()
	if reply["executor_id"] != env.executorID || reply["application_version"] != appVersion ||
		reply["hostname"] != hostname || reply["language"] != "go" || reply["dbos_version"] != "v1.9.0" {
		t.Fatalf("executor_info %v", reply)
	}
	if metadata, _ := json.Marshal(reply["executor_metadata"]); string(metadata) != `{"rack":7,"zone":"test-a"}` {
		t.Fatalf("executor_metadata %s", metadata)
	}
	if reply := newAsker(t, false, nil).ok("executor_info", nil); reply["executor_metadata"] != nil {
		t.Fatalf("executor_metadata %v", reply["executor_metadata"])
	}
}

func TestListWorkflowsRepliesInPascalCaseWithEpochMSDigits(t *testing.T) {
	a := newAsker(t, false, nil)
	id := runWorkflow(t, greet, "world")
	listed := list(t, a.ok("list_workflows", m{"body": m{"workflow_uuids": []string{id}}})["output"])
	if len(listed) != 1 {
		t.Fatalf("listed %v", listed)
	}
	w := listed[0]
	if !slices.Equal(keys(w), sorted(workflowFields)) {
		t.Fatalf("fields %v", keys(w))
	}
	s := status(t, id)
	if w["WorkflowUUID"] != id || w["Status"] != "SUCCESS" || w["WorkflowName"] != "greet" ||
		w["ExecutorID"] != env.executorID || w["ApplicationVersion"] != appVersion ||
		w["ApplicationName"] != testApp || w["Error"] != nil || w["WasForkedFrom"] != false {
		t.Fatalf("workflow %v", w)
	}
	if !strings.Contains(w["Input"].(string), "world") || !strings.HasPrefix(w["Output"].(string), `"hello world `) {
		t.Fatalf("input %v output %v", w["Input"], w["Output"])
	}
	for _, name := range []string{"CreatedAt", "UpdatedAt", "CompletedAt"} {
		if !isDigits(w[name]) {
			t.Fatalf("%s is %#v", name, w[name])
		}
	}
	if w["CreatedAt"] != *epochMS(s.CreatedAt) || w["CompletedAt"] != *epochMS(s.CompletedAt) {
		t.Fatalf("times %v %v", w["CreatedAt"], w["CompletedAt"])
	}
	for name, value := range w { // the protocol's fields are text (or null), the one flag aside
		if _, isText := value.(string); value != nil && !isText && name != "WasForkedFrom" {
			t.Fatalf("%s is %#v", name, value)
		}
	}
}

func TestListWorkflowsFiltersSortsAndPages(t *testing.T) {
	a := newAsker(t, false, nil)
	prefix := "page-" + uuid4() + "-"
	var ids []string
	for _, n := range []string{"0", "1", "2"} {
		handle, err := dbos.RunWorkflow(env.ctx, greet, n, dbos.WithWorkflowID(prefix+n))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = handle.GetResult()
		ids = append(ids, prefix+n)
	}
	idsOf := func(out any) []string {
		var got []string
		for _, w := range list(t, out) {
			got = append(got, w["WorkflowUUID"].(string))
		}
		return got
	}
	if got := idsOf(a.ok("list_workflows", m{"body": m{"workflow_id_prefix": prefix}})["output"]); !slices.Equal(got, ids) {
		t.Fatalf("listed %v", got)
	}
	newest := a.ok("list_workflows", m{"body": m{"workflow_id_prefix": prefix, "sort_desc": true, "limit": 2,
		"load_input": false, "load_output": false}})["output"]
	if got := idsOf(newest); !slices.Equal(got, []string{ids[2], ids[1]}) {
		t.Fatalf("newest %v", got)
	}
	for _, w := range list(t, newest) {
		if w["Input"] != nil || w["Output"] != nil {
			t.Fatalf("loaded %v", w)
		}
	}
	paged := a.ok("list_workflows", m{"body": m{"workflow_id_prefix": prefix, "offset": 1, "limit": 1}})["output"]
	if got := idsOf(paged); !slices.Equal(got, []string{ids[1]}) {
		t.Fatalf("paged %v", got)
	}
	if got := idsOf(a.ok("list_workflows", m{"body": m{"workflow_id_prefix": prefix, "status": "ERROR"}})["output"]); len(got) != 0 {
		t.Fatalf("errors %v", got)
	}
	if got := idsOf(a.ok("list_workflows", m{"body": m{"workflow_id_prefix": []string{prefix},
		"status": []string{"SUCCESS"}, "workflow_name": "greet"}})["output"]); len(got) != 3 {
		t.Fatalf("lists as filters %v", got)
	}
}

func TestGetWorkflow(t *testing.T) {
	a := newAsker(t, false, nil)
	id := runWorkflow(t, failing, "")
	w := a.ok("get_workflow", m{"workflow_id": id})["output"].(m)
	if w["WorkflowUUID"] != id || w["Status"] != "ERROR" || !strings.Contains(w["Error"].(string), "broken") {
		t.Fatalf("workflow %v", w)
	}
	if reply := a.ok("get_workflow", m{"workflow_id": "missing-" + uuid4()}); reply["output"] != nil {
		t.Fatalf("missing workflow %v", reply["output"])
	}
}

func TestListQueuedWorkflowsAndQueues(t *testing.T) {
	a := newAsker(t, false, nil)
	id := "parked-" + uuid4()
	if _, err := dbos.RunWorkflow(env.ctx, greet, "later", dbos.WithWorkflowID(id), dbos.WithQueue(env.parked)); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dbos.CancelWorkflows(env.ctx, []string{id}) }()
	queued := list(t, a.ok("list_queued_workflows", m{"body": m{"queue_name": parkedQueue}})["output"])
	found := false
	for _, w := range queued {
		found = found || w["WorkflowUUID"] == id
		if w["Status"] != "ENQUEUED" {
			t.Fatalf("queued %v", w)
		}
	}
	if !found {
		t.Fatalf("%s not in %v", id, queued)
	}
	queues := map[string]m{}
	for _, q := range list(t, a.ok("list_queues", nil)["output"]) {
		queues[q["name"].(string)] = q
	}
	if queues[workQueue] == nil || queues[parkedQueue] == nil || queues[workQueue]["worker_concurrency"] != 4.0 {
		t.Fatalf("queues %v", queues)
	}
	work := a.ok("get_queue", m{"name": workQueue})["output"]
	got, _ := json.Marshal(work)
	want, _ := json.Marshal(queues[workQueue])
	if string(got) != string(want) {
		t.Fatalf("get_queue %s, list_queues %s", got, want)
	}
	if reply := a.ok("get_queue", m{"name": "missing-" + uuid4()}); reply["output"] != nil {
		t.Fatalf("missing queue %v", reply["output"])
	}
}

// stepsOf is a workflow's steps as the SDK lists them.
func stepsOf(t *testing.T, id string) []dbos.StepInfo {
	t.Helper()
	steps, err := dbos.GetWorkflowSteps(env.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

func TestListSteps(t *testing.T) {
	a := newAsker(t, false, nil)
	id := runWorkflow(t, caughtFailure, "")
	steps := list(t, a.ok("list_steps", m{"workflow_id": id})["output"])
	var names []string
	for _, s := range steps {
		names = append(names, s["function_name"].(string))
		if !isDigits(s["started_at_epoch_ms"]) || !isDigits(s["completed_at_epoch_ms"]) {
			t.Fatalf("step times %v", s)
		}
	}
	if !slices.Equal(names, []string{"token", "broken", "token"}) {
		t.Fatalf("steps %v", names)
	}
	if steps[0]["error"] != nil || steps[1]["output"] != nil || !strings.Contains(steps[1]["error"].(string), "broken") {
		t.Fatalf("steps %v", steps)
	}
	second := steps[1]["function_id"]
	paged := list(t, a.ok("list_steps", m{"workflow_id": id, "limit": 1, "offset": 1})["output"])
	if len(paged) != 1 || paged[0]["function_id"] != second {
		t.Fatalf("paged %v", paged)
	}
	for _, s := range list(t, a.ok("list_steps", m{"workflow_id": id, "load_output": false})["output"]) {
		if s["output"] != nil {
			t.Fatalf("loaded %v", s)
		}
	}
}

func TestCancelThenResume(t *testing.T) {
	a := newAsker(t, false, nil)
	first, second := startWaiter(t), startWaiter(t)
	if a.ok("cancel", m{"workflow_id": first})["success"] != true {
		t.Fatal("cancel")
	}
	finished(t, first, dbos.WorkflowStatusCancelled)
	if status(t, second).Status != dbos.WorkflowStatusPending {
		t.Fatal("the other waiter was touched")
	}
	a.ok("cancel", m{"workflow_ids": []string{second}})
	finished(t, second, dbos.WorkflowStatusCancelled)
	for _, id := range []string{first, second} {
		release(t, id, "go") // the message the resumed execution will find
	}
	if a.ok("resume", m{"workflow_ids": []string{first, second}})["success"] != true {
		t.Fatal("resume")
	}
	for _, id := range []string{first, second} {
		if w := finished(t, id, dbos.WorkflowStatusSuccess); w.Output != `"released"` {
			t.Fatalf("output %#v", w.Output)
		}
	}
}

func TestDelete(t *testing.T) {
	a := newAsker(t, false, nil)
	kept, first, second := runWorkflow(t, greet, "a"), runWorkflow(t, greet, "b"), runWorkflow(t, greet, "c")
	a.ok("delete", m{"workflow_id": first})
	a.ok("delete", m{"workflow_ids": []string{second}})
	if status(t, first) != nil || status(t, second) != nil || status(t, kept) == nil {
		t.Fatal("delete removed the wrong workflows")
	}
	if steps := list(t, a.ok("list_steps", m{"workflow_id": first})["output"]); len(steps) != 0 {
		t.Fatalf("steps of a deleted workflow %v", steps)
	}
}

// copiedSteps are the ids of the steps of fork copied from original's steps rather than run again: those with the
// same output and error (each execution of token and broken yields a new uuid).
func copiedSteps(t *testing.T, original []dbos.StepInfo, fork string) []int {
	t.Helper()
	key := func(s dbos.StepInfo) string {
		return valueOrEmpty(valueJSON(s.Output)) + "|" + valueOrEmpty(errorText(s.Error))
	}
	before := map[int]string{}
	for _, s := range original {
		before[s.StepID] = key(s)
	}
	var copied []int
	for _, s := range stepsOf(t, fork) {
		if k, ok := before[s.StepID]; ok && k == key(s) {
			copied = append(copied, s.StepID)
		}
	}
	return copied
}

func valueOrEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestForkWorkflow(t *testing.T) {
	a := newAsker(t, false, nil)
	original := runWorkflow(t, caughtFailure, "")
	steps := stepsOf(t, original)
	newID := "fork-" + uuid4()
	reply := a.ok("fork_workflow", m{"body": m{"workflow_id": original, "start_step": steps[1].StepID,
		"new_workflow_id": newID}})
	if reply["new_workflow_id"] != newID {
		t.Fatalf("fork %v", reply)
	}
	if w := finished(t, newID, dbos.WorkflowStatusSuccess); w.ForkedFrom != original {
		t.Fatalf("forked from %q", w.ForkedFrom)
	}
	if got := copiedSteps(t, steps, newID); !slices.Equal(got, []int{steps[0].StepID}) {
		t.Fatalf("copied %v", got)
	}
	if !status(t, original).WasForkedFrom {
		t.Fatal("the original is not marked forked from")
	}
	forks := list(t, a.ok("list_workflows", m{"body": m{"forked_from": original}})["output"])
	if len(forks) != 1 || forks[0]["WorkflowUUID"] != newID {
		t.Fatalf("forks %v", forks)
	}
	drawn := a.ok("fork_workflow", m{"body": m{"workflow_id": original, "start_step": 0}})["new_workflow_id"].(string)
	finished(t, drawn, dbos.WorkflowStatusSuccess)
	if got := copiedSteps(t, steps, drawn); len(got) != 0 {
		t.Fatalf("copied %v", got)
	}
}

func TestForkFromFailure(t *testing.T) {
	// caught_failure's steps: the first succeeds, the second fails, the third succeeds; a fork from a step copies
	// the steps before it.
	for _, mode := range []struct {
		name  string
		body  func(steps []dbos.StepInfo) m
		start int // index of the start step
	}{
		{"from_last_failure", func([]dbos.StepInfo) m { return m{"from_last_failure": true} }, 1},
		{"from_last_step", func([]dbos.StepInfo) m { return m{"from_last_step": true} }, 2},
		{"from_step", func(s []dbos.StepInfo) m { return m{"from_step": s[0].StepID} }, 0},
		{"from_step_name", func([]dbos.StepInfo) m { return m{"from_step_name": "token"} }, 2},
	} {
		t.Run(mode.name, func(t *testing.T) {
			a := newAsker(t, false, nil)
			original := runWorkflow(t, caughtFailure, "")
			steps := stepsOf(t, original)
			body := mode.body(steps)
			body["workflow_ids"] = []string{original}
			forked := a.ok("fork_from_failure", m{"body": body})["forked_workflow_ids"].([]any)
			if len(forked) != 1 {
				t.Fatalf("forked %v", forked)
			}
			fork := forked[0].(string)
			if w := finished(t, fork, dbos.WorkflowStatusSuccess); w.ForkedFrom != original {
				t.Fatalf("forked from %q", w.ForkedFrom)
			}
			var want []int
			for _, s := range steps[:mode.start] {
				want = append(want, s.StepID)
			}
			if got := copiedSteps(t, steps, fork); !slices.Equal(got, want) {
				t.Fatalf("copied %v, want %v", got, want)
			}
		})
	}
}

func TestForkFromFailureOfFailedWorkflows(t *testing.T) {
	a := newAsker(t, false, nil)
	first, second := runWorkflow(t, failing, ""), runWorkflow(t, failing, "")
	forks := a.ok("fork_from_failure", m{"body": m{"workflow_ids": []string{first, second},
		"from_last_failure": true}})["forked_workflow_ids"].([]any)
	if len(forks) != 2 {
		t.Fatalf("forks %v", forks)
	}
	for i, original := range []string{first, second} {
		if w := finished(t, forks[i].(string), dbos.WorkflowStatusError); w.ForkedFrom != original {
			t.Fatalf("forked from %q", w.ForkedFrom) // the failing step fails again
		}
	}
	reply := a.ask("fork_from_failure", m{"body": m{"workflow_ids": []string{first}, "from_step_name": "none"}})
	if !strings.Contains(reply["error_message"].(string), "has no step named 'none'") || reply["forked_workflow_ids"] != nil {
		t.Fatalf("reply %v", reply)
	}
}

func TestForkFromFailureNeedsExactlyOneMode(t *testing.T) {
	a := newAsker(t, false, nil)
	for _, modes := range []m{{}, {"from_last_failure": true, "from_last_step": true}, {"from_last_failure": false}} {
		modes["workflow_ids"] = []string{"x"}
		reply := a.ask("fork_from_failure", m{"body": modes})
		if !strings.Contains(reply["error_message"].(string), "exactly one of") || reply["forked_workflow_ids"] != nil {
			t.Fatalf("reply %v", reply)
		}
	}
}

func TestAFailedOperationRepliesWithItsContextAndError(t *testing.T) {
	missing := "missing-" + uuid4()
	reply := newAsker(t, false, nil).ask("fork_workflow", m{"body": m{"workflow_id": missing, "start_step": 1}})
	message := reply["error_message"].(string)
	if reply["new_workflow_id"] != nil || !strings.HasPrefix(message, "Exception encountered when forking a workflow: ") ||
		!strings.Contains(message, missing) {
		t.Fatalf("reply %v", reply)
	}
	withheld := newAsker(t, true, nil).ask("fork_workflow", m{"body": m{"workflow_id": missing, "start_step": 1}})
	message = withheld["error_message"].(string)
	if !strings.Contains(message, "details withheld in metadata-only mode") || strings.Contains(message, missing) {
		t.Fatalf("metadata-only reply %v", withheld)
	}
}

func TestApplicationVersions(t *testing.T) {
	a := newAsker(t, false, nil)
	versions := list(t, a.ok("list_application_versions", nil)["output"])
	var names []string
	for _, v := range versions {
		names = append(names, v["version_name"].(string))
	}
	if !slices.Contains(names, appVersion) ||
		!slices.Equal(keys(versions[0]), []string{"created_at", "version_id", "version_name", "version_timestamp"}) {
		t.Fatalf("versions %v", versions)
	}
	a.ok("set_latest_application_version", m{"version_name": appVersion})
	latest, err := dbos.GetLatestApplicationVersion(env.ctx)
	if err != nil || latest.Name != appVersion {
		t.Fatalf("latest %v %v", latest, err)
	}
}

func TestRewindWorkflow(t *testing.T) {
	a := newAsker(t, false, nil)
	id := runWorkflow(t, caughtFailure, "")
	before := stepsOf(t, id)
	a.ok("rewind_workflow", m{"body": m{"workflow_id": id, "start_step": before[2].StepID}})
	eventually(t, 15*time.Second, "the rewound workflow running again", func() bool {
		steps := stepsOf(t, id)
		return status(t, id).Status == dbos.WorkflowStatusSuccess && len(steps) == 3 &&
			valueOrEmpty(valueJSON(steps[2].Output)) != valueOrEmpty(valueJSON(before[2].Output))
	})
	if got := copiedSteps(t, before, id); !slices.Equal(got, []int{before[0].StepID, before[1].StepID}) {
		t.Fatalf("kept %v", got)
	}
}

func TestAggregates(t *testing.T) {
	a := newAsker(t, false, nil)
	prefix := "agg-" + uuid4() + "-"
	for _, n := range []string{"0", "1"} {
		handle, err := dbos.RunWorkflow(env.ctx, greet, n, dbos.WithWorkflowID(prefix+n))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = handle.GetResult()
	}
	rows := list(t, a.ok("get_workflow_aggregates", m{"body": m{"group_by_status": true,
		"workflow_id_prefix": prefix}})["output"])
	if len(rows) != 1 || rows[0]["count"] != 2.0 || rows[0]["group"].(m)["status"] != "SUCCESS" {
		t.Fatalf("workflow aggregates %v", rows)
	}
	steps := list(t, a.ok("get_step_aggregates", m{"body": m{"group_by_function_name": true,
		"workflow_id_prefix": prefix, "select_count": true}})["output"])
	if len(steps) != 1 || steps[0]["count"] != 2.0 || steps[0]["group"].(m)["function_name"] != "token" {
		t.Fatalf("step aggregates %v", steps)
	}
	reply := a.ask("get_workflow_aggregates", m{"body": m{"group_by_status": true, "time_bucket_size_ms": 0}})
	if !strings.Contains(reply["error_message"].(string), "time_bucket_size_ms must be > 0") {
		t.Fatalf("reply %v", reply)
	}
}

func TestUnsupportedOperationsSaySo(t *testing.T) {
	a := newAsker(t, false, nil)
	for _, kind := range unsupportedTypes {
		reply := a.ask(kind, m{"workflow_id": "w", "body": m{}, "serialized_workflow": "x"})
		message, _ := reply["error_message"].(string)
		if reply["unsupported"] != true || !strings.Contains(message, kind) || !strings.Contains(message, "v1.9.0") {
			t.Fatalf("%s: %v", kind, reply)
		}
		failedFieldsMatch(t, a, kind, reply)
	}
	if reply := a.ok("list_queues", nil); reply["unsupported"] != nil {
		t.Fatalf("a supported reply says unsupported: %v", reply)
	}
}

func TestAlertCallsTheHandler(t *testing.T) {
	a := newAsker(t, false, nil)
	a.ok("alert", m{"name": "disk", "message": "full", "metadata": m{"host": "a"}})
	a.ok("alert", m{"name": "cpu", "message": "hot"})
	reply := a.ask("alert", m{"name": "disk"})
	if reply["success"] != false || !strings.Contains(reply["error_message"].(string), "'message' is required") {
		t.Fatalf("reply %v", reply)
	}
	if len(a.alerts) != 2 || a.alerts[0].name != "disk" || a.alerts[0].metadata["host"] != "a" || a.alerts[1].name != "cpu" {
		t.Fatalf("alerts %v", a.alerts)
	}
}

func TestAPanickingAlertHandlerIsAnError(t *testing.T) {
	ops := &operations{ctx: env.ctx, sdkVersion: "v1.9.0", log: testLogger(t, nil),
		onAlert: func(string, string, map[string]string) { panic("handler broke") }}
	var reply m
	frame := `{"type": "alert", "request_id": "r", "name": "n", "message": "x"}`
	_ = json.Unmarshal(Handle([]byte(frame), ops.table(), false, testLogger(t, nil)), &reply)
	if reply["success"] != false || !strings.Contains(reply["error_message"].(string), "handler broke") {
		t.Fatalf("reply %v", reply)
	}
}

func TestAnUnknownType(t *testing.T) {
	reply := newAsker(t, false, nil).ask("no_such_type", m{"workflow_id": "w"})
	if len(reply) != 3 || reply["error_message"] != UnknownType || UnknownType != "Unknown message type" {
		t.Fatalf("reply %v", reply)
	}
}

func TestMalformedFramesAreAnsweredNotRaised(t *testing.T) {
	a := newAsker(t, false, nil)
	for _, c := range []struct{ frame, kind, requestID, error string }{
		{"not json", "", "", "not JSON"},
		{"\xff\xfe", "", "", "not JSON"},
		{strings.Repeat("[", 100_000), "", "", "not JSON"},
		{`{"type": "executor_info", "request_id": "r"} trailing`, "", "", "not JSON"},
		{`[{"type": "executor_info", "request_id": "r"}]`, "", "", "not a JSON object"},
		{`"executor_info"`, "", "", "not a JSON object"},
		{"null", "", "", "not a JSON object"},
		{`{"type": "get_workflow", "workflow_id": "w"}`, "get_workflow", "", "'request_id' must be"},
		{`{"request_id": "r1"}`, "", "r1", "'type' and 'request_id' must be strings"},
		{`{"type": 5, "request_id": "r1"}`, "", "r1", "must be strings"},
		{`{"type": "get_workflow", "request_id": 7}`, "get_workflow", "", "must be strings"},
	} {
		reply := a.raw(c.frame)
		message, _ := reply["error_message"].(string)
		if reply["type"] != c.kind || reply["request_id"] != c.requestID ||
			!strings.HasPrefix(message, "malformed message") || !strings.Contains(message, c.error) {
			t.Errorf("%.40q: %v", c.frame, reply)
		}
	}
}

func TestBadFieldsAreAnsweredWithAnError(t *testing.T) {
	a := newAsker(t, false, nil)
	for _, c := range []struct {
		kind   string
		fields m
		error  string
	}{
		{"get_workflow", m{}, "field 'workflow_id' is required"},
		{"get_workflow", m{"workflow_id": nil}, "field 'workflow_id' is required"},
		{"get_workflow", m{"workflow_id": 5}, "field 'workflow_id' must be a string, not a number"},
		{"get_workflow", m{"workflow_id": []string{"w"}}, "field 'workflow_id' must be a string, not a list"},
		{"list_workflows", m{}, "field 'body' must be an object"},
		{"list_workflows", m{"body": []any{}}, "field 'body' must be an object"},
		{"list_workflows", m{"body": m{"limit": true}}, "field 'limit' must be an integer, not a boolean"},
		{"list_workflows", m{"body": m{"limit": "10"}}, "field 'limit' must be an integer, not a string"},
		{"list_workflows", m{"body": m{"limit": 1.5}}, "field 'limit' must be an integer, not 1.5"},
		{"list_workflows", m{"body": m{"status": 3}}, "field 'status' must be a string or a list, not a number"},
		{"list_workflows", m{"body": m{"sort_desc": "yes"}}, "field 'sort_desc' must be a boolean, not a string"},
		{"list_workflows", m{"body": m{"start_time": "yesterday"}}, "field 'start_time' must be an ISO 8601 time"},
		{"cancel", m{"workflow_ids": []any{"a", 2}}, "field 'workflow_ids' must be a list of strings"},
		{"cancel", m{"workflow_ids": "a"}, "field 'workflow_ids' must be a list, not a string"},
		{"cancel", m{}, "field 'workflow_id' is required"},
		{"recovery", m{"executor_ids": []any{5}}, "field 'executor_ids' must be a list of strings"},
		{"recovery", m{"executor_ids": "dead"}, "field 'executor_ids' must be a list, not a string"},
		{"recovery", m{}, "field 'executor_ids' is required"},
		{"fork_workflow", m{"body": m{"workflow_id": "w"}}, "field 'start_step' is required"},
		{"fork_workflow", m{"body": m{"workflow_id": "w", "start_step": true}}, "'start_step' must be an integer"},
		{"fork_workflow", m{"body": m{"workflow_id": "w", "start_step": -1}}, "a start step must be between"},
		{"retention", m{"body": m{"gc_cutoff_epoch_ms": "1"}}, "field 'gc_cutoff_epoch_ms' must be an integer"},
		{"alert", m{"name": "n", "message": "m", "metadata": []any{}}, "field 'metadata' must be an object"},
		{"fork_from_failure", m{"body": m{"workflow_ids": []any{1}, "from_step": 1}}, "must be a list of strings"},
		{"backfill_schedule", m{"schedule_name": "s", "start": "yesterday", "end": "now"}, "must be an ISO 8601 time"},
	} {
		reply := a.ask(c.kind, c.fields)
		message, _ := reply["error_message"].(string)
		if !strings.HasPrefix(message, c.kind+" request") || !strings.Contains(message, c.error) {
			t.Errorf("%s %v: %q", c.kind, c.fields, message)
			continue
		}
		failedFieldsMatch(t, a, c.kind, reply)
	}
}

func TestMetadataOnlyMode(t *testing.T) {
	a := newAsker(t, true, nil)
	failed := runWorkflow(t, failing, "")
	withSecret := runWorkflow(t, withEvent, event{"secret", "value"})
	for _, kind := range []string{"get_workflow_events", "get_workflow_notifications", "get_workflow_streams",
		"export_workflow", "import_workflow"} {
		reply := a.ask(kind, m{"workflow_id": withSecret})
		if !strings.Contains(reply["error_message"].(string), "metadata-only") || reply["unsupported"] != nil {
			t.Fatalf("%s: %v", kind, reply)
		}
	}
	listed := list(t, a.ok("list_workflows", m{"body": m{"workflow_uuids": []string{failed, withSecret},
		"load_input": true, "load_output": true}})["output"])
	if len(listed) != 2 {
		t.Fatalf("listed %v", listed)
	}
	for _, w := range listed {
		if w["Input"] != nil || w["Output"] != nil || w["Error"] != nil || !isDigits(w["CreatedAt"]) {
			t.Fatalf("workflow %v", w)
		}
	}
	got := a.ok("get_workflow", m{"workflow_id": failed})["output"].(m)
	if got["Status"] != "ERROR" || got["Input"] != nil || got["Error"] != nil {
		t.Fatalf("workflow %v", got)
	}
	for _, s := range list(t, a.ok("list_steps", m{"workflow_id": failed, "load_output": true})["output"]) {
		if s["output"] != nil || s["error"] != nil {
			t.Fatalf("step %v", s)
		}
	}
}
