package lincheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/raftlockd/raftlockd/client"
)

// Op is one recorded operation (a logical one: an acquire or release that
// was retried after an ambiguous attempt is one operation from the first
// call to the last answer).
type Op struct {
	Client   int
	Input    Input
	Output   Output
	Node     string // the node the client talks to
	Attempts int
	Err      string // the last error, if any
}

// Event is something the nemesis did, in recorder time.
type Event struct {
	At   int64
	Desc string
}

// Recorder collects a history. It is safe for concurrent use.
type Recorder struct {
	base time.Time

	mu     sync.Mutex
	ops    []Op
	events []Event
	leases map[string]string // lease id -> name
}

// NewRecorder starts a history whose clock starts now.
func NewRecorder() *Recorder {
	return &Recorder{base: time.Now(), leases: map[string]string{}}
}

// Now is the recorder's monotonic clock in nanoseconds.
func (r *Recorder) Now() int64 { return int64(time.Since(r.base)) }

// LeaseName returns the short name of a lease id, the same for every call
// with the same id.
func (r *Recorder) LeaseName(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.leases[id]; ok {
		return n
	}
	n := fmt.Sprintf("L%d", len(r.leases)+1)
	r.leases[id] = n
	return n
}

// Add records a completed operation.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Note records a nemesis event.
func (r *Recorder) Note(format string, args ...any) {
	e := Event{At: r.Now(), Desc: fmt.Sprintf(format, args...)}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Ops returns the operations recorded so far, by call time.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	out := append([]Op(nil), r.ops...)
	r.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Input.Call < out[j].Input.Call })
	return out
}

// Events returns the nemesis events.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// Open is the return time of ambiguous operations in a porcupine history:
// after everything else, since they may take effect at any time.
const Open = int64(math.MaxInt64 / 2)

// informative reports whether an operation constrains the model. Rejected
// and ambiguous acquires and failed reads never do (see Step), so they stay
// out of the porcupine history, which keeps the search small; the
// visualization shows them as annotations.
func informative(op Op) bool {
	switch op.Input.Kind {
	case KindAcquire:
		return op.Output.Status == StatusOK
	case KindPublicGet:
		return op.Output.Status == StatusOK
	case KindLeaseGet:
		return op.Output.Status != StatusUnknown && !notReached(op.Output.Code)
	}
	return !(op.Output.Status == StatusFail && notReached(op.Output.Code))
}

// Porcupine converts ops into a porcupine history (informative operations
// only) and returns the others separately.
func Porcupine(ops []Op) (history []porcupine.Operation, rest []Op) {
	for _, op := range ops {
		if !informative(op) {
			rest = append(rest, op)
			continue
		}
		ret := op.Input.Return
		if op.Output.Status == StatusUnknown {
			ret = Open
		}
		history = append(history, porcupine.Operation{ClientId: op.Client, Input: op.Input, Call: op.Input.Call,
			Output: op.Output, Return: ret, Metadata: op.meta()})
	}
	return history, rest
}

func (op Op) meta() string {
	var parts []string
	if op.Node != "" {
		parts = append(parts, "via "+op.Node)
	}
	parts = append(parts, fmt.Sprintf("[%s, %s]", secs(op.Input.Call), secs(op.Input.Return)))
	if op.Attempts > 1 {
		parts = append(parts, fmt.Sprintf("%d attempts", op.Attempts))
	}
	if op.Err != "" {
		parts = append(parts, op.Err)
	}
	return strings.Join(parts, " ")
}

// attempt is the outcome of one HTTP exchange.
type attempt struct {
	status Status
	code   string
	// decided: the answer came from the state machine (ok or a rejection
	// in Apply), so it also settles earlier ambiguous attempts of a
	// retried acquire or release.
	decided bool
	err     error
}

// classify sorts an error from the client. Rejections (4xx) come from
// validation or from the state machine and changed nothing. no_leader and
// not_leader are answered before anything is proposed; a dial error means
// the request was never sent. Everything else (timeouts, broken
// connections, unavailable, shutdown_draining, request_cancelled, 500) may
// have taken effect. An acquire that was queued and whose cancellation
// failed answers with the cancellation's error while it may still have been
// granted, so for acquires no 503 is definite.
func classify(kind Kind, err error) attempt {
	if err == nil {
		return attempt{status: StatusOK, decided: true}
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		code := ce.Envelope.Code
		switch {
		case ce.Status >= 400 && ce.Status < 500 && ce.Status != 499:
			return attempt{status: StatusFail, code: code, decided: true, err: err}
		case (code == "no_leader" || code == "not_leader") && kind != KindAcquire:
			return attempt{status: StatusFail, code: code, err: err}
		}
		return attempt{status: StatusUnknown, code: code, err: err}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return attempt{status: StatusFail, code: "dial", err: err}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return attempt{status: StatusUnknown, code: "timeout", err: err}
	default:
		return attempt{status: StatusUnknown, code: "io", err: err}
	}
}

// combine folds the attempts of a retried operation into one outcome: the
// last one if the state machine decided it, else ambiguous if any attempt
// was, else the last (definite, never reached a leader) failure.
func combine(as []attempt) attempt {
	last := as[len(as)-1]
	if last.decided {
		return last
	}
	for _, a := range as {
		if a.status == StatusUnknown {
			out := last
			out.status = StatusUnknown
			if last.status != StatusUnknown {
				out.code = a.code
			}
			return out
		}
	}
	return last
}

// unexpected reports codes that no operation of the workload should ever
// get: they point at a bug in the workload or in the server.
func unexpected(kind Kind, a attempt) bool {
	switch a.code {
	case "", "timeout", "io", "dial", "no_leader", "not_leader", "unavailable", "shutdown_draining", "request_cancelled":
		return false
	case "waiting":
		return kind != KindAcquire
	case "lease_required", "lease_expired", "lease_mismatch", "txn_rolled_back":
		return kind == KindAcquire || kind == KindPublicGet
	case "version_conflict", "etag_mismatch":
		return kind != KindUpdate && kind != KindRemove
	}
	return true
}
