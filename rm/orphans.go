package rm

import (
	"context"
	"log/slog"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
)

// WithdrawOrphans withdraws, each time a state is installed on this server
// (an operator's restore reaches every server so, as does a snapshot from
// the leader), the requests that state has waiting on self that no request
// waits for here: an acquire or dequeue that was waiting when the backup
// was taken and has ended since, or one of an earlier run of the server.
// Left in line, it would be granted the key, or handed a message, for a
// client that is gone, holding it until its lease ran out. A request that
// still waits here keeps its place (it proposes itself again when told of
// the restore), and a withdrawal names the acquire's attempt, so one that a
// retry took over stays. It returns when ctx ends.
func WithdrawOrphans(ctx context.Context, store Store, waits *Waits, self Server, log *slog.Logger) {
	retry := time.NewTimer(0)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-waits.restored:
		case <-retry.C:
		}
		var waiting []fsm.WaitingRequest
		_ = store.ReadStale(ctx, func(v *fsm.View) error {
			waiting = v.WaitingOn(self.ID)
			return nil
		})
		failed, withdrawn := 0, 0
		for _, r := range waiting {
			if r.Run == self.Run && waits.registered(r.RequestID) {
				continue
			}
			cmd := &fsm.Command{Op: fsm.OpCancelWait, CancelWait: &fsm.CancelWaitCmd{Namespace: r.Namespace, Key: r.Key,
				RequestID: r.RequestID, Attempt: r.Attempt}}
			if r.Queue != "" {
				cmd = &fsm.Command{Op: fsm.OpQCancel, QCancel: &fsm.QueueCancelCmd{Namespace: r.Namespace, Queue: r.Queue,
					RequestID: r.RequestID}}
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := store.Propose(pctx, cmd)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && res == nil:
				failed++ // not applied: tried again
			case res != nil && res.Cancelled:
				withdrawn++
			}
		}
		if withdrawn > 0 {
			log.Info("withdrew the requests the installed state had waiting on this server for clients no longer waiting",
				"withdrawn", withdrawn)
		}
		if failed > 0 {
			log.Warn("could not withdraw every request the installed state had waiting on this server; trying again",
				"failed", failed)
			retry.Reset(time.Second)
		}
	}
}
