package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// packer sends the leader's commands to Raft one entry at a time: while an
// entry is on its way to the state machine, the commands proposed meanwhile
// wait, and then go together as the next entry (fsm.EncodePacked).
//
// raft's main loop stores a batch of entries, then picks at random among
// what is ready: the news that a batch committed, or more entries to store.
// Every time it picks more entries, the committed batch waits for one more
// log append (two fdatasync calls) before it is applied. With one entry
// offered at a time, and the next one offered only once the state machine
// has begun the previous one, a commit never waits behind an append, and
// the next append still runs while the previous entry is applied.
type packer struct {
	send    func(data []byte, timeout time.Duration) (raft.Future, error)
	packs   func() bool        // every server applies packed entries
	sent    func(commands int) // told of every entry offered (metrics)
	maxSize int                // bytes of commands packed into one entry, unless one alone is larger

	mu     sync.Mutex
	queue  []*proposal
	busy   bool   // an entry was offered to raft and the state machine has not begun it
	flight []byte // that entry: the very slice raft hands the state machine (nil until built)
}

// proposal is one command waiting for its result.
type proposal struct {
	data     []byte
	deadline time.Time
	done     chan proposed
}

type proposed struct {
	resp interface{}
	err  error
}

// defaultProposeTimeout bounds the wait for raft to take a command whose
// caller set no deadline.
const defaultProposeTimeout = 10 * time.Second

// propose replicates data, an encoded command, and returns what the state
// machine answered. A caller whose context ends while its command waits for
// the entry before it gets an error and the command is never proposed; once
// the command is offered to raft, propose waits for raft's answer, as
// raft.Apply does.
func (p *packer) propose(ctx context.Context, data []byte) (interface{}, error) {
	deadline := time.Now().Add(defaultProposeTimeout)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	if !p.packs() {
		p.sent(1)
		f, err := p.send(data, max(time.Until(deadline), time.Millisecond))
		if err != nil {
			return nil, err
		}
		return f.(raft.ApplyFuture).Response(), nil
	}
	me := &proposal{data: data, deadline: deadline, done: make(chan proposed, 1)}
	p.mu.Lock()
	p.queue = append(p.queue, me)
	next := p.take()
	p.mu.Unlock()
	if next != nil {
		p.offer(next) // with this command in it: nothing to wait for before
	}
	select {
	case r := <-me.done:
		return r.resp, r.err
	case <-ctx.Done():
		if p.withdraw(me) {
			return nil, fmt.Errorf("cluster: not proposed: %w", context.Cause(ctx))
		}
		r := <-me.done
		return r.resp, r.err
	}
}

// take removes the commands of the next entry from the queue, unless an
// entry is on its way. The caller holds mu and offers what it gets. Once
// packing is off (a server of an older build is in the configuration), the
// commands that queued meanwhile go one per entry.
// The size counts the packed framing (fsm.EncodePacked's bound) too.
func (p *packer) take() []*proposal {
	if p.busy || len(p.queue) == 0 {
		return nil
	}
	const frame = binary.MaxVarintLen64
	n, size := 1, 1+frame+frame+len(p.queue[0].data)
	for p.packs() && n < len(p.queue) && n < fsm.MaxPacked && size+frame+len(p.queue[n].data) <= p.maxSize {
		size += frame + len(p.queue[n].data)
		n++
	}
	batch := make([]*proposal, n)
	copy(batch, p.queue)
	p.queue = append(p.queue[:0], p.queue[n:]...)
	p.busy = true
	return batch
}

// withdraw takes a waiting command out of the queue; false when it was
// already offered to raft.
func (p *packer) withdraw(me *proposal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, q := range p.queue {
		if q == me {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			return true
		}
	}
	return false
}

// offer proposes the commands of batch as one entry (a single command as
// it is) and hands every caller its result.
func (p *packer) offer(batch []*proposal) {
	data := batch[0].data
	deadline := batch[0].deadline
	if len(batch) > 1 {
		cmds := make([][]byte, len(batch))
		for i, q := range batch {
			cmds[i] = q.data
			if q.deadline.After(deadline) {
				deadline = q.deadline
			}
		}
		data = fsm.EncodePacked(cmds)
	}
	p.mu.Lock()
	p.flight = data
	p.mu.Unlock()
	p.sent(len(batch))
	f, err := p.send(data, max(time.Until(deadline), time.Millisecond))
	// Normally the state machine began the entry already (reached); when
	// raft failed it, or applied it from elsewhere than this slice, the
	// next entry goes now.
	p.land(data)
	if err != nil {
		for _, q := range batch {
			q.done <- proposed{err: err}
		}
		return
	}
	resp := f.(raft.ApplyFuture).Response()
	rs, packed := resp.(fsm.Results)
	for i, q := range batch {
		switch {
		case len(batch) == 1:
			q.done <- proposed{resp: resp}
		case packed && len(rs) == len(batch):
			q.done <- proposed{resp: rs[i]}
		case packed:
			q.done <- proposed{err: errcode.Internal.With("state machine answered %d results for %d commands", len(rs), len(batch))}
		default:
			q.done <- proposed{resp: resp} // the whole entry was refused
		}
	}
}

// reached is called as the state machine begins logs: when the entry on
// its way is among them, the next one is offered.
func (p *packer) reached(logs []*raft.Log) {
	p.mu.Lock()
	flight := p.flight
	p.mu.Unlock()
	if amongLogs(flight, logs) {
		p.land(flight)
	}
}

// land ends the flight of data, if it is the entry on its way, and offers
// the next entry.
func (p *packer) land(data []byte) {
	p.mu.Lock()
	if !p.busy || !sameSlice(p.flight, data) {
		p.mu.Unlock()
		return
	}
	p.busy, p.flight = false, nil
	next := p.take()
	p.mu.Unlock()
	if next != nil {
		go p.offer(next)
	}
}

func amongLogs(data []byte, logs []*raft.Log) bool {
	for _, l := range logs {
		if sameSlice(l.Data, data) {
			return true
		}
	}
	return false
}

// sameSlice tells whether a and b are the same bytes in memory: raft hands
// the state machine the slice it was given.
func sameSlice(a, b []byte) bool {
	return len(a) > 0 && len(a) == len(b) && &a[0] == &b[0]
}
