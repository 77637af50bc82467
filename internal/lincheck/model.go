// Package lincheck checks raftlockd's lease and state API for
// linearizability while nodes crash, restart and get partitioned.
//
// Concurrent clients run random acquire / update / lease get / public get /
// release sequences on a few keys and a Recorder keeps every call with its
// real-time interval, its inputs and its outcome: ok, a definite rejection
// (the operation had no effect), or ambiguous (it may or may not have taken
// effect). A Nemesis breaks the cluster meanwhile. Check runs the history
// through porcupine against Model, a sequential specification of one key
// (the history is partitioned by key), and additionally checks that fencing
// tokens grow in real-time order and that a lease never succeeds once a
// later lease of its key has been granted. After the faults, each key is
// read, then acquired and read again with the new lease: the clients'
// abandoned leases must have run out by then and rolled their writes back.
//
// Time in a history is the recorder's monotonic clock in nanoseconds. The
// model uses it for lease expiry: a lease acquired by an operation that ran
// over [call, ret] with a TTL expires at some moment in
// [call+TTL, ret+TTL] (give or take Slack), so an operation may see it alive
// only if it started before the window's end, and may see it expired (or
// another lease take the key over) only if it ended after the window's
// start.
package lincheck

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Slack widens every lease expiry window. The server judges expiry with
// millisecond stamps of the leader's wall clock, the recorder with the
// monotonic clock of the same process.
const Slack = int64(50 * time.Millisecond)

// Kind is an operation of the lease/state API.
type Kind uint8

// The operations clients perform.
const (
	KindAcquire   Kind = iota + 1 // POST /v1/acquire
	KindUpdate                    // POST /v1/update (staged under the lease's transaction)
	KindLeaseGet                  // POST /v1/get with the lease: the holder's view
	KindPublicGet                 // POST /v1/get?public=1: the committed document
	KindRelease                   // POST /v1/release, commit or rollback
)

func (k Kind) String() string {
	switch k {
	case KindAcquire:
		return "acquire"
	case KindUpdate:
		return "update"
	case KindLeaseGet:
		return "get"
	case KindPublicGet:
		return "public-get"
	case KindRelease:
		return "release"
	}
	return "kind" + strconv.Itoa(int(k))
}

// Status classifies an outcome.
type Status uint8

// Outcomes.
const (
	StatusOK      Status = iota + 1
	StatusFail           // definitely rejected: the operation had no effect
	StatusUnknown        // ambiguous: it may or may not have taken effect, at any time after its call
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusFail:
		return "fail"
	case StatusUnknown:
		return "unknown"
	}
	return "status" + strconv.Itoa(int(s))
}

// Input is what an operation asked for.
type Input struct {
	Kind Kind
	Key  string
	// Lease names the lease an update, lease get or release speaks for
	// (the recorder's name for it, such as "L7"); LeaseMinExp and
	// LeaseMaxExp bound the moment it expires (recorder time, ns).
	Lease       string
	LeaseMinExp int64
	LeaseMaxExp int64
	Value       string // update: the document written
	Rollback    bool   // release: roll back instead of committing
	TTL         int64  // acquire: the lease's TTL (ns)
	// Call and Return repeat the operation's interval for the model's time
	// checks. Return is when the caller got its (last) answer, also for an
	// ambiguous operation whose history entry stays open.
	Call   int64
	Return int64
}

// Output is what an operation got.
type Output struct {
	Status  Status
	Code    string // error code of a failure, cause of an ambiguous outcome
	Lease   string // acquire: the granted lease's name
	Token   int64  // acquire: its fencing token
	Exists  bool   // gets: a document exists
	Value   string // gets: the document
	Version int64  // acquire, gets: the (visible) version; update: the new version
}

// State is one key as the model sees it. Expiry is lazy: the holder stays
// the holder until it releases or another lease takes the key over, but
// from MinExp on it may be expired, and then its own operations may fail
// and others may take the key.
type State struct {
	Holder    string // lease holding the key; "" when free
	Token     int64  // the holder's fencing token
	MinExp    int64  // earliest moment the holder's lease may expire
	HasStaged bool   // the holder's transaction staged a write
	Staged    string
	Committed string // committed document; "" when there is none
	Version   int64  // committed version
	MaxToken  int64  // highest fencing token granted so far
}

// A failure code the model accepts from a lease operation when the lease no
// longer holds the key or may have expired (a release asking to commit after
// the expiry rolled the transaction back answers txn_rolled_back).
func leaseGone(code string) bool {
	switch code {
	case "lease_required", "lease_expired", "lease_mismatch", "txn_rolled_back":
		return true
	}
	return false
}

// notReached are definite failures of requests that never reached a leader.
func notReached(code string) bool {
	return code == "no_leader" || code == "not_leader" || code == "dial"
}

// Step returns the states the key may be in after the operation, none when
// the operation could not have produced its output from s.
func Step(s State, in Input, out Output) []State {
	mine := s.Holder != "" && s.Holder == in.Lease
	alive := mine && in.Call < in.LeaseMaxExp // some moment in the call saw it unexpired
	mayBeGone := !mine || in.Return >= in.LeaseMinExp
	failOK := func() []State {
		if notReached(out.Code) || (leaseGone(out.Code) && mayBeGone) {
			return []State{s}
		}
		return nil
	}
	switch in.Kind {
	case KindAcquire:
		if out.Status != StatusOK {
			// A rejected acquire changed nothing. An ambiguous one may have
			// granted a lease nobody learned of; such a lease only makes the
			// key busier and expires like any other, which the model never
			// needs to explain anything: "no grant" allows every later
			// operation the grant would allow.
			return []State{s}
		}
		if s.Holder != "" && in.Return < s.MinExp {
			return nil // the holder's lease cannot have expired yet
		}
		if out.Token <= s.MaxToken || out.Version != s.Version {
			return nil
		}
		n := s
		n.Holder, n.Token, n.MinExp = out.Lease, out.Token, in.Call+in.TTL-Slack
		n.HasStaged, n.Staged = false, "" // an expired holder's writes were rolled back
		n.MaxToken = out.Token
		return []State{n}

	case KindUpdate:
		staged := s
		staged.HasStaged, staged.Staged = true, in.Value
		switch out.Status {
		case StatusOK:
			if !alive || out.Version != s.Version+1 {
				return nil
			}
			return []State{staged}
		case StatusFail:
			return failOK()
		}
		if alive {
			return []State{s, staged}
		}
		return []State{s}

	case KindLeaseGet:
		switch out.Status {
		case StatusOK:
			if !alive {
				return nil
			}
			if s.HasStaged {
				if !out.Exists || out.Value != s.Staged || out.Version != s.Version+1 {
					return nil
				}
			} else if !sameDoc(s, out) {
				return nil
			}
			return []State{s}
		case StatusFail:
			return failOK()
		}
		return []State{s}

	case KindPublicGet:
		if out.Status == StatusOK && !sameDoc(s, out) {
			return nil
		}
		return []State{s}

	case KindRelease:
		done := s
		done.Holder, done.Token, done.MinExp, done.HasStaged, done.Staged = "", 0, 0, false, ""
		if !in.Rollback && s.HasStaged {
			done.Committed, done.Version = s.Staged, s.Version+1
		}
		switch out.Status {
		case StatusOK:
			if in.Rollback {
				if mine {
					return []State{done}
				}
				// A lease that expired was rolled back by the leader; a
				// rollback asking for that outcome is answered from the
				// recorded decision.
				if in.Return >= in.LeaseMinExp {
					return []State{s}
				}
				return nil
			}
			if !alive {
				return nil
			}
			return []State{done}
		case StatusFail:
			return failOK()
		}
		if (in.Rollback && mine) || (!in.Rollback && alive) {
			return []State{s, done}
		}
		return []State{s}
	}
	return nil
}

func sameDoc(s State, out Output) bool {
	return out.Exists == (s.Committed != "") && out.Value == s.Committed && out.Version == s.Version
}

func hashState(s State) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%t\x00%s\x00%s\x00%d\x00%d", s.Holder, s.Token, s.MinExp, s.HasStaged, s.Staged,
		s.Committed, s.Version, s.MaxToken)
	return h.Sum64()
}

// Nondeterministic is the model of one key as porcupine's nondeterministic
// model: ambiguous updates and releases branch into "took effect" and "did
// not".
func Nondeterministic() porcupine.NondeterministicModel {
	return porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []interface{} { return []interface{}{State{}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := Step(state.(State), input.(Input), output.(Output))
			out := make([]interface{}, len(next))
			for i, n := range next {
				out[i] = n
			}
			return out
		},
		Equal:             func(a, b interface{}) bool { return a.(State) == b.(State) },
		Hash:              func(s interface{}) uint64 { return hashState(s.(State)) },
		DescribeOperation: func(in, out interface{}) string { return DescribeOp(in.(Input), out.(Output)) },
		DescribeState:     func(s interface{}) string { return DescribeState(s.(State)) },
		DescribeOperationMetadata: func(m interface{}) string {
			if m == nil {
				return ""
			}
			return fmt.Sprint(m)
		},
	}
}

// Model is Nondeterministic as a porcupine model.
func Model() porcupine.Model {
	m := Nondeterministic()
	return m.ToModel()
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(Input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// secs renders recorder time.
func secs(ns int64) string { return strconv.FormatFloat(float64(ns)/1e9, 'f', 3, 64) + "s" }

func doc(exists bool, v string) string {
	if !exists {
		return "none"
	}
	return v
}

// DescribeOp renders an operation for logs and the visualization.
func DescribeOp(in Input, out Output) string {
	var b strings.Builder
	switch in.Kind {
	case KindAcquire:
		fmt.Fprintf(&b, "acquire(%s)", in.Key)
	case KindUpdate:
		fmt.Fprintf(&b, "update(%s, %s, %s)", in.Key, in.Lease, in.Value)
	case KindLeaseGet:
		fmt.Fprintf(&b, "get(%s, %s)", in.Key, in.Lease)
	case KindPublicGet:
		fmt.Fprintf(&b, "public-get(%s)", in.Key)
	case KindRelease:
		what := "commit"
		if in.Rollback {
			what = "rollback"
		}
		fmt.Fprintf(&b, "release(%s, %s, %s)", in.Key, in.Lease, what)
	default:
		fmt.Fprintf(&b, "%s(%s)", in.Kind, in.Key)
	}
	b.WriteString(" -> ")
	switch out.Status {
	case StatusOK:
		switch in.Kind {
		case KindAcquire:
			fmt.Fprintf(&b, "%s token %d v%d", out.Lease, out.Token, out.Version)
		case KindUpdate:
			fmt.Fprintf(&b, "v%d", out.Version)
		case KindLeaseGet, KindPublicGet:
			fmt.Fprintf(&b, "%s v%d", doc(out.Exists, out.Value), out.Version)
		default:
			b.WriteString("ok")
		}
	case StatusFail:
		b.WriteString(out.Code)
	default:
		b.WriteString("? " + out.Code)
	}
	return b.String()
}

// DescribeState renders a key's state.
func DescribeState(s State) string {
	var b strings.Builder
	if s.Holder == "" {
		b.WriteString("free")
	} else {
		fmt.Fprintf(&b, "%s token %d (may expire from %s)", s.Holder, s.Token, secs(s.MinExp))
		if s.HasStaged {
			fmt.Fprintf(&b, " staged %s", s.Staged)
		}
	}
	fmt.Fprintf(&b, "; committed %s v%d; max token %d", doc(s.Committed != "", s.Committed), s.Version, s.MaxToken)
	return b.String()
}
