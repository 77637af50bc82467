// Package lincheck checks raftlockd's lease and state API for
// linearizability while nodes crash, restart and get partitioned.
//
// Concurrent clients run random acquire / keepalive / update (now and then
// guarded by X-If-Version or X-If-State-ETag) / remove / lease get / public
// get / release sequences on a few keys and a Recorder keeps every call with its
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
// start. A keepalive that took effect at a moment t of its interval, which
// it can only have done while the lease was alive, moves the expiry to
// t+TTL: the window becomes [call+TTL, min(ret, old window's end)+TTL], and
// for an ambiguous keepalive, which may take effect any time after its call
// while the lease lives, [call+TTL, old window's end+TTL].
package lincheck

import (
	"crypto/sha256"
	"encoding/hex"
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
	KindKeepAlive                 // POST /v1/keepalive
	KindRemove                    // POST /v1/remove (staged like an update)
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
	case KindKeepAlive:
		return "keepalive"
	case KindRemove:
		return "remove"
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
	// Lease names the lease a keepalive, update, remove, lease get or
	// release speaks for (the recorder's name for it, such as "L7");
	// LeaseMinExp and LeaseMaxExp bound the moment it expires as its
	// client knows it (recorder time, ns). The model judges the lease's
	// own operations by the window in its State; LeaseMinExp tells when a
	// lease that no longer holds the key may have run out.
	Lease       string
	LeaseMinExp int64
	LeaseMaxExp int64
	Value       string // update: the document written
	Rollback    bool   // release: roll back instead of committing
	// TTL is the lease's TTL (ns) for an acquire, and for a keepalive what
	// it extends the lease by. A lease's TTL never shrinks (a keepalive
	// names its current TTL or a longer one), so each keepalive that takes
	// effect moves the expiry later.
	TTL int64
	// Conditions of an update or remove: X-If-Version when HasIfVersion,
	// X-If-State-ETag when HasIfETag (IfETag "" asks for no document).
	HasIfVersion bool
	IfVersion    int64
	HasIfETag    bool
	IfETag       string
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
	Version int64  // acquire, gets: the (visible) version; update, remove: the new version
	Removed bool   // remove: a document was there to remove
	// CurrentVersion and CurrentETag come with a version_conflict or
	// etag_mismatch: the holder's view the condition was compared with.
	CurrentVersion int64
	CurrentETag    string
}

// State is one key as the model sees it. Expiry is lazy: the holder stays
// the holder until it releases or another lease takes the key over, but
// from MinExp on it may be expired, and then its own operations may fail
// and others may take the key; from MaxExp on it is expired, and its own
// operations cannot succeed any more.
type State struct {
	Holder    string // lease holding the key; "" when free
	Token     int64  // the holder's fencing token
	MinExp    int64  // earliest moment the holder's lease may expire
	MaxExp    int64  // latest moment the holder's lease may expire
	HasStaged bool   // the holder's transaction staged a write
	Staged    string // the staged document; "" for a staged removal
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

// ETag is a document's ETag: the hex SHA-256 of its compact form (the
// workload writes compact documents); "" for no document.
func ETag(doc string) string {
	if doc == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(doc))
	return hex.EncodeToString(sum[:])
}

// view is the holder's view of the key: its staged write (a removal
// included) if it made one, else the committed document.
func (s State) view() (doc string, version int64) {
	if s.HasStaged {
		return s.Staged, s.Version + 1
	}
	return s.Committed, s.Version
}

// condition is the outcome a write's conditions call for against the
// holder's view: "" when they hold, else the refusal's code. The version
// is compared first.
func condition(s State, in Input) string {
	doc, version := s.view()
	switch {
	case in.HasIfVersion && in.IfVersion != version:
		return "version_conflict"
	case in.HasIfETag && in.IfETag != ETag(doc):
		return "etag_mismatch"
	}
	return ""
}

// Step returns the states the key may be in after the operation, none when
// the operation could not have produced its output from s.
func Step(s State, in Input, out Output) []State {
	mine := s.Holder != "" && s.Holder == in.Lease
	alive := mine && in.Call < s.MaxExp // some moment in the call saw it unexpired
	mayBeGone := !mine || in.Return >= s.MinExp
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
		n.Holder, n.Token = out.Lease, out.Token
		n.MinExp, n.MaxExp = in.Call+in.TTL-Slack, in.Return+in.TTL+Slack
		n.HasStaged, n.Staged = false, "" // an expired holder's writes were rolled back
		n.MaxToken = out.Token
		return []State{n}

	case KindKeepAlive:
		// The expiry moves to t+TTL for the moment t the keepalive took
		// effect, which is no later than the old expiry; the lease's TTL
		// never shrinks, so neither does its expiry.
		ext := s
		ext.MinExp = max(s.MinExp, in.Call+in.TTL-Slack)
		switch out.Status {
		case StatusOK:
			if !alive {
				return nil
			}
			ext.MaxExp = min(in.Return+Slack, s.MaxExp) + in.TTL
			return []State{ext}
		case StatusFail:
			return failOK()
		}
		if alive {
			ext.MaxExp = s.MaxExp + in.TTL
			return []State{s, ext}
		}
		return []State{s}

	case KindUpdate, KindRemove:
		doc, version := s.view()
		staged := s
		staged.HasStaged, staged.Staged = true, in.Value
		if in.Kind == KindRemove {
			// Removing from a view without a document stages nothing.
			staged.Staged = ""
			if doc == "" {
				staged = s
			}
		}
		cond := condition(s, in)
		switch out.Status {
		case StatusOK:
			if !alive || cond != "" {
				return nil
			}
			want := s.Version + 1 // the staged version
			if in.Kind == KindRemove {
				if out.Removed != (doc != "") {
					return nil
				}
				if !out.Removed {
					want = version
				}
			}
			if out.Version != want {
				return nil
			}
			return []State{staged}
		case StatusFail:
			if out.Code == "version_conflict" || out.Code == "etag_mismatch" {
				// Refused by its condition: the lease held the key, and the
				// refusal names the view it compared with.
				if !alive || out.Code != cond || out.CurrentVersion != version || out.CurrentETag != ETag(doc) {
					return nil
				}
				return []State{s}
			}
			return failOK()
		}
		if alive && cond == "" {
			return []State{s, staged}
		}
		return []State{s}

	case KindLeaseGet:
		switch out.Status {
		case StatusOK:
			if !alive {
				return nil
			}
			doc, version := s.view()
			if out.Exists != (doc != "") || out.Value != doc || out.Version != version {
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
		done.Holder, done.Token, done.MinExp, done.MaxExp, done.HasStaged, done.Staged = "", 0, 0, 0, false, ""
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
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00%t\x00%s\x00%s\x00%d\x00%d", s.Holder, s.Token, s.MinExp, s.MaxExp, s.HasStaged,
		s.Staged, s.Committed, s.Version, s.MaxToken)
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
		fmt.Fprintf(&b, "update(%s, %s, %s%s)", in.Key, in.Lease, in.Value, conditions(in))
	case KindRemove:
		fmt.Fprintf(&b, "remove(%s, %s%s)", in.Key, in.Lease, conditions(in))
	case KindKeepAlive:
		fmt.Fprintf(&b, "keepalive(%s, %s, %s)", in.Key, in.Lease, secs(in.TTL))
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
		case KindRemove:
			fmt.Fprintf(&b, "removed %t v%d", out.Removed, out.Version)
		case KindLeaseGet, KindPublicGet:
			fmt.Fprintf(&b, "%s v%d", doc(out.Exists, out.Value), out.Version)
		default:
			b.WriteString("ok")
		}
	case StatusFail:
		b.WriteString(out.Code)
		if out.Code == "version_conflict" || out.Code == "etag_mismatch" {
			fmt.Fprintf(&b, " (current v%d etag %s)", out.CurrentVersion, short(out.CurrentETag))
		}
	default:
		b.WriteString("? " + out.Code)
	}
	return b.String()
}

// conditions renders an update's or removal's conditions.
func conditions(in Input) string {
	var b strings.Builder
	if in.HasIfVersion {
		fmt.Fprintf(&b, ", if v%d", in.IfVersion)
	}
	if in.HasIfETag {
		fmt.Fprintf(&b, ", if etag %s", short(in.IfETag))
	}
	return b.String()
}

// short abbreviates an ETag.
func short(etag string) string {
	if etag == "" {
		return `""`
	}
	return etag[:min(8, len(etag))]
}

// DescribeState renders a key's state.
func DescribeState(s State) string {
	var b strings.Builder
	if s.Holder == "" {
		b.WriteString("free")
	} else {
		fmt.Fprintf(&b, "%s token %d (expires within [%s, %s])", s.Holder, s.Token, secs(s.MinExp), secs(s.MaxExp))
		if s.HasStaged {
			fmt.Fprintf(&b, " staged %s", doc(s.Staged != "", s.Staged))
			if s.Staged == "" {
				b.WriteString(" (removal)")
			}
		}
	}
	fmt.Fprintf(&b, "; committed %s v%d; max token %d", doc(s.Committed != "", s.Committed), s.Version, s.MaxToken)
	return b.String()
}
