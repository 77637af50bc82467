package sweeper

import (
	"context"
	"log/slog"
	"time"

	"github.com/raftlockd/raftlockd/internal/leaderloop"
	"github.com/raftlockd/raftlockd/wire"
)

// Pass runs one prune pass through Raft.
type Pass interface {
	Prune(ctx context.Context) (*wire.UTXOPruneResponse, error)
}

// PruneDue tells whether a prune pass has work: a transaction past its
// delete-at-height, a preserve that ended, an undo delta out of the
// rollback window, or a retention and window in the replicated state that
// are not this server's. The mark names the chain (height and tip) the
// pass would judge the transactions by.
type PruneDue interface {
	PruneDue() (due bool, mark string)
}

// Pruner runs prune passes on the leader, one as it starts leading and one
// per interval after that while there is work, off the request path: each
// pass is a bounded Raft entry that resumes from the cursor the previous
// one left in the replicated state, so a new leader carries on where the
// old one stopped.
//
// A transaction past its delete-at-height that a pass keeps (a spending
// child unmined or too recent) stays due. Once a whole cycle of passes
// (up to the one that wraps) did nothing but keep transactions, all of
// them judged by one chain (a block during the cycle is work), the
// pruner waits for the chain to move on before the next pass, or at most
// idleIntervals intervals (a child marked mined in an old block moves no
// chain): an idle island does not commit a prune entry every interval.
type Pruner struct {
	pass     Pass
	due      PruneDue
	interval time.Duration
	log      *slog.Logger
	leaderloop.Loop
}

// NewPruner returns a stopped pruner.
func NewPruner(p Pass, due PruneDue, interval time.Duration, log *slog.Logger) *Pruner {
	if interval <= 0 {
		interval = time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return &Pruner{pass: p, due: due, interval: interval, log: log}
}

// SetLeader starts the pruner when this node gains leadership and stops it
// when leadership is lost. It does not block.
func (p *Pruner) SetLeader(isLeader bool) { p.Set(isLeader, p.run) }

// idleIntervals bounds how many intervals an idle pruner waits for the
// chain to move on.
const idleIntervals = 60

func (p *Pruner) run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	var (
		idle      bool   // the last cycle of passes only kept transactions
		idleMark  string // the chain it judged by
		idleSince time.Time
		// A pass of the current cycle did something. A leader's first
		// cycle counts as work: it may begin in the middle of a cycle
		// whose first passes an earlier leader ran on another chain.
		worked    = true
		cycleMark string // the chain the first pass of the current cycle judged by
		inCycle   bool
	)
	for {
		due, mark := p.due.PruneDue()
		if due && idle && mark == idleMark && time.Since(idleSince) < idleIntervals*p.interval {
			due = false
		}
		if due {
			res, err := p.pass.Prune(ctx)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					p.log.Warn("prune pass failed", "error", err)
				}
			default:
				idle = false
				if !inCycle {
					cycleMark, inCycle = mark, true
				}
				// A cycle over which the chain moved on judged its first
				// transactions by another chain than its last: what it
				// kept may go on the chain it ended on.
				worked = worked || len(res.Pruned) > 0 || res.Preserved > 0 || res.DeltasFreed > 0 || mark != cycleMark
				if res.Wrapped {
					idle, idleMark, idleSince = !worked, mark, time.Now()
					worked, inCycle = false, false
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
