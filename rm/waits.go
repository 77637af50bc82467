package rm

import (
	"sync"

	"github.com/raftlockd/raftlockd/fsm"
)

// Waits connects queued acquire requests to the state machine: it observes
// every applied batch and hands grant and give-up events to the requests
// registered under their request id. It is how a blocked acquirer learns,
// without polling, that the step that released the key granted it the lease.
//
// Every attempt of a request (a retry carries the first attempt's request
// id) hears of a grant, since they all want that lease; the end of a wait
// goes only to the attempt that was waiting, so a retry that took the
// queued place over is not sent away by the end of an attempt it replaced.
type Waits struct {
	mu      sync.Mutex
	waiting map[string][]listener
	// restored is signalled when a state is installed (WithdrawOrphans).
	restored chan struct{}
}

type listener struct {
	attempt string
	kind    waitKind
	ch      chan fsm.Event
}

// waitKind says what a listener waits for: only acquirers count as the
// node's waiters (Len).
type waitKind uint8

const (
	waitAcquire  waitKind = iota // a blocked acquire
	waitDequeue                  // a blocked dequeue
	waitDelivery                 // the end of a subscription's delivery
)

// NewWaits returns an empty registry.
func NewWaits() *Waits {
	return &Waits{waiting: make(map[string][]listener), restored: make(chan struct{}, 1)}
}

// register starts listening for the outcome of attempt of requestID. It
// must be called before the acquire is proposed, so an immediate grant
// cannot be missed.
func (w *Waits) register(requestID, attempt string, kind waitKind) (<-chan fsm.Event, func()) {
	ch := make(chan fsm.Event, 1)
	w.mu.Lock()
	w.waiting[requestID] = append(w.waiting[requestID], listener{attempt: attempt, kind: kind, ch: ch})
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.waiting[requestID]
		for i, l := range list {
			if l.ch == ch {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(w.waiting, requestID)
		} else {
			w.waiting[requestID] = list
		}
	}
}

// Observe implements fsm.Observer.
func (w *Waits) Observe(events []fsm.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range events {
		if e.Kind == fsm.EventRestored {
			w.tellAll(e)
			select {
			case w.restored <- struct{}{}:
			default:
			}
			continue
		}
		if e.Kind != fsm.EventGranted && e.Kind != fsm.EventWaitEnded && e.Kind != fsm.EventDelivered && e.Kind != fsm.EventDeliveryEnded {
			continue
		}
		for _, l := range w.waiting[e.RequestID] {
			if e.Kind == fsm.EventWaitEnded && e.Attempt != "" && e.Attempt != l.attempt {
				continue
			}
			tell(l.ch, e)
		}
	}
}

// tellAll hands e to every request waiting on this node. Called with w.mu
// held.
func (w *Waits) tellAll(e fsm.Event) {
	for _, list := range w.waiting {
		for _, l := range list {
			tell(l.ch, e)
		}
	}
}

// tell hands e to a listener unless it has already been told something
// else: a restore's event gives way to an outcome, which would otherwise be
// lost while the listener has not yet read that it has to ask again. Only
// Observe sends, with w.mu held.
func tell(ch chan fsm.Event, e fsm.Event) {
	select {
	case ch <- e:
		return
	default:
	}
	select {
	case old := <-ch:
		if e.Kind == fsm.EventRestored || old.Kind != fsm.EventRestored {
			e = old // already told
		}
	default: // read meanwhile
	}
	select {
	case ch <- e:
	default:
	}
}

// registered reports whether a request of requestID waits on this node.
func (w *Waits) registered(requestID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiting[requestID]) > 0
}

// Len reports how many acquire requests are waiting on this node.
func (w *Waits) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, list := range w.waiting {
		for _, l := range list {
			if l.kind == waitAcquire {
				n++
			}
		}
	}
	return n
}
