package relay

// Recovery of a dead executor's workflows: the one call this client makes outside DBOS's public API.
//
// RecoverPendingWorkflows(executorIDs) is what Launch itself runs for the process's own id, and what v1.6.0's
// built-in conductor client ran for Relay's recovery request: for each id, the PENDING workflows it owned on this
// process's application version go back on DBOS's internal queue, in one update guarded by their status and owner,
// so a second request finds nothing and still succeeds. No public call does this for another executor's id; v1.9
// exports it in package dbos/internals (plural, importable), and it is kept behind this one function, tested
// against the pinned release.

import (
	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/dbos-inc/dbos-transact-golang/dbos/internals"
)

// recoverPending re-enqueues the PENDING workflows of executorIDs (this process's version); how many were found.
func recoverPending(ctx dbos.Context, executorIDs []string) (int, error) {
	runtime, err := internals.RuntimeOf(ctx)
	if err != nil {
		return 0, err
	}
	handles, err := runtime.RecoverPendingWorkflows(executorIDs)
	return len(handles), err
}
