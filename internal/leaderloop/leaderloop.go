// Package leaderloop runs the goroutine of a leader-only task (the sweeper,
// the pruner, the coordinator's resolver): started when this node gains
// leadership, cancelled when it loses it, and a new one started only after
// the previous one returned, so two never run at once.
package leaderloop

import (
	"context"
	"sync"
)

// Loop runs one goroutine while this node leads. The zero value is ready.
type Loop struct {
	mu      sync.Mutex
	stopped bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Set starts run in a new goroutine when isLeader (once the previous one
// returned) and cancels the running one otherwise. It does not block.
func (l *Loop) Set(isLeader bool, run func(ctx context.Context)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
	if !isLeader || l.stopped {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	prev := l.done
	done := make(chan struct{})
	l.done = done
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		run(ctx)
	}()
}

// Stop stops the loop for good and waits for its goroutine.
func (l *Loop) Stop() {
	l.mu.Lock()
	l.stopped = true
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
	done := l.done
	l.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Running reports whether a loop goroutine is active: started and not yet
// returned (a loop that lost leadership counts until its in-flight
// proposal has been answered and it has exited).
func (l *Loop) Running() bool {
	select {
	case <-l.Stopped():
		return false
	default:
		return true
	}
}

// Stopped returns a channel that is closed once the latest loop has
// exited, with any proposal it had in flight answered; it is already closed
// when no loop was ever started. A loop started later gets a new channel.
func (l *Loop) Stopped() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		return closedCh
	}
	return l.done
}

var closedCh = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
