package bench

import (
	"context"
	"fmt"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Raftlockd drives raftlockd through the Go client; worker w talks to
// Clients[w % len(Clients)], so that load spreads over a cluster's nodes.
type Raftlockd struct {
	Clients []*client.Client
}

func (r *Raftlockd) c(worker int) *client.Client { return r.Clients[worker%len(r.Clients)] }

// Name implements Driver.
func (r *Raftlockd) Name() string { return "raftlockd" }

// LockCycle implements Driver: acquire, update, release (commit).
func (r *Raftlockd) LockCycle(ctx context.Context, worker int, key string, payload []byte) error {
	l, err := r.c(worker).Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "bench", TTLSeconds: 30})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	if _, err := l.Update(ctx, payload, client.Conditions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	if err := l.Release(ctx, false); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// Handoff implements Driver: wait for the shared key, then release it.
func (r *Raftlockd) Handoff(ctx context.Context, worker int, key string) error {
	l, err := r.c(worker).Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "bench", TTLSeconds: 30})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	if err := l.Release(ctx, false); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}
