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
// are not this server's.
type PruneDue interface {
	PruneDue() bool
}

// Pruner runs prune passes on the leader, one as it starts leading and one
// per interval after that while there is work, off the request path: each pass is a bounded Raft entry that
// resumes from the cursor the previous one left in the replicated state,
// so a new leader carries on where the old one stopped.
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

func (p *Pruner) run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		if p.due.PruneDue() {
			if _, err := p.pass.Prune(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("prune pass failed", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
