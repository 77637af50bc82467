package rm

import (
	"context"
	"log/slog"
	"strings"
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
// retry took over stays. One granted the key, or handed a message, between
// the read of the state and its withdrawal (a sweep of the installed
// state's expired leases) hands it back. It returns when ctx ends.
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
			case res != nil && res.Lease != nil && !strings.HasPrefix(r.RequestID, idemPrefix):
				// Granted the key after the state was read. A request
				// named by an idempotency key may have been granted it
				// as a retry elsewhere, which took its place over: that
				// lease is the retry's.
				handBackLease(ctx, store, res.Lease)
				withdrawn++
			case res != nil && res.Queue != nil && res.Queue.Message != nil && res.Queue.Message.Lease != nil:
				// Handed a message after the state was read.
				handBackDelivery(ctx, store, res.Queue.Message)
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

// handBackLease releases lease l, granted to a request nobody waits for,
// rolling back its transaction when the lease is all it holds. A
// transaction that holds more is its client's, which may still decide it:
// that lease runs out instead.
func handBackLease(ctx context.Context, store Store, l *fsm.LeaseInfo) {
	alone := false
	_ = store.ReadStale(ctx, func(v *fsm.View) error {
		t := v.Txn(l.TxnID)
		alone = t != nil && len(t.Participants) == 1
		return nil
	})
	if !alone {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, _ = store.Propose(pctx, &fsm.Command{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{Namespace: l.Namespace,
		Key: l.Key, LeaseID: l.LeaseID, TxnID: l.TxnID, Token: l.Token, Rollback: true}})
}

// handBackDelivery returns message m, delivered to a request nobody waits
// for, to its queue without counting a failed delivery, as the API does
// with a delivery it cannot hand over. One enlisted in a transaction is
// left to its lease: a nack would decide the transaction.
func handBackDelivery(ctx context.Context, store Store, m *fsm.MessageInfo) {
	if m.Lease.TxnID != "" {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, _ = store.Propose(pctx, &fsm.Command{Op: fsm.OpQNack, QNack: &fsm.QueueNackCmd{MessageRef: fsm.MessageRef{
		Namespace: m.Namespace, Queue: m.Queue, ID: m.ID, LeaseID: m.Lease.ID, Token: m.Lease.Token}, Defer: true}})
}
