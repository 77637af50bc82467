package lincheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Result is the verdict on one history.
type Result struct {
	Porcupine porcupine.CheckResult
	// Violations are the findings of the checks outside porcupine (fencing
	// token order, exclusive holding, unexpected error codes).
	Violations []string
	Checked    int           // operations in the porcupine history
	Skipped    int           // operations left out of it (no information)
	Elapsed    time.Duration // porcupine's time
	// Failed: porcupine found the history illegal, a check outside it
	// found a violation, or porcupine timed out on a small history (see
	// CheckOptions.SmallHistory).
	Failed bool
	// Visualization is the porcupine HTML of a failing history and
	// HistoryFile the recorded operations as JSON, when written.
	Visualization string
	HistoryFile   string
}

// OK reports whether the history passed (an Unknown porcupine result is
// not a failure here; the caller decides).
func (r Result) OK() bool { return r.Porcupine != porcupine.Illegal && len(r.Violations) == 0 }

// CheckOptions tune Check.
type CheckOptions struct {
	Timeout time.Duration // porcupine's budget; 0: none
	// SmallHistory: a porcupine timeout (Unknown) on a history of at most
	// this many operations is a failure; on a larger one it is not.
	SmallHistory int
	// OutDir receives the visualization and the history when the check
	// fails (Result.Failed) or when Always is set; empty: nothing is
	// written.
	OutDir string
	Name   string // file name prefix
	Always bool
}

// checkOperations is porcupine's check (a variable for the tests).
var checkOperations = porcupine.CheckOperationsTimeout

// Check verifies a history: porcupine against Model, then the token and
// exclusivity checks.
func Check(ops []Op, events []Event, o CheckOptions) Result {
	history, rest := Porcupine(ops)
	res := Result{Checked: len(history), Skipped: len(rest)}
	res.Violations = append(res.Violations, CheckTokens(ops)...)
	res.Violations = append(res.Violations, CheckExclusive(ops)...)
	for _, op := range ops {
		a := attempt{status: op.Output.Status, code: op.Output.Code}
		if unexpected(op.Input.Kind, a) {
			res.Violations = append(res.Violations, fmt.Sprintf("unexpected answer: client %d %s (%s)", op.Client,
				DescribeOp(op.Input, op.Output), op.Err))
		}
	}
	model := Model()
	start := time.Now()
	res.Porcupine = checkOperations(model, history, o.Timeout)
	res.Elapsed = time.Since(start)
	res.Failed = !res.OK() || res.Porcupine == porcupine.Unknown && res.Checked <= o.SmallHistory
	if o.OutDir == "" || (!res.Failed && !o.Always) {
		return res
	}
	_ = os.MkdirAll(o.OutDir, 0o755)
	base := filepath.Join(o.OutDir, o.Name)
	// Verbose again for the partial linearizations the visualization shows.
	_, info := porcupine.CheckOperationsVerbose(model, history, o.Timeout)
	info.AddAnnotations(annotations(rest, events))
	if err := porcupine.VisualizePath(model, info, base+".html"); err == nil {
		res.Visualization = base + ".html"
	}
	if raw, err := json.MarshalIndent(struct {
		Ops    []Op
		Events []Event
	}{ops, events}, "", " "); err == nil && os.WriteFile(base+".json", raw, 0o644) == nil {
		res.HistoryFile = base + ".json"
	}
	return res
}

// annotations show what porcupine does not check: operations without
// information and the nemesis' actions.
func annotations(rest []Op, events []Event) []porcupine.Annotation {
	var out []porcupine.Annotation
	for _, op := range rest {
		bg := "#e8e8e8"
		if op.Output.Status == StatusUnknown {
			bg = "#ffe7a8"
		}
		out = append(out, porcupine.Annotation{ClientId: op.Client, Start: op.Input.Call, End: op.Input.Return,
			Description: DescribeOp(op.Input, op.Output), Details: op.meta(), BackgroundColor: bg})
	}
	for _, e := range events {
		out = append(out, porcupine.Annotation{Tag: "nemesis", Start: e.At, Description: e.Desc, BackgroundColor: "#f6c0c0"})
	}
	return out
}

type grant struct {
	op  Op
	end int64 // no earlier than this, the lease stopped holding the key
}

// grants lists the successful acquires of each key with the earliest moment
// each lease may have stopped holding: the start of its expiry window after
// the last keepalive answered ok (a lease's TTL never shrinks, so every
// keepalive that takes effect moves its expiry later), or the call of its
// release (ok or ambiguous), whichever comes first.
func grants(ops []Op) map[string][]grant {
	released := map[string]int64{}
	kept := map[string]int64{}
	for _, op := range ops {
		switch {
		case op.Input.Kind == KindRelease && op.Output.Status != StatusFail:
			if t, ok := released[op.Input.Lease]; !ok || op.Input.Call < t {
				released[op.Input.Lease] = op.Input.Call
			}
		case op.Input.Kind == KindKeepAlive && op.Output.Status == StatusOK:
			kept[op.Input.Lease] = max(kept[op.Input.Lease], op.Input.Call+op.Input.TTL-Slack)
		}
	}
	out := map[string][]grant{}
	for _, op := range ops {
		if op.Input.Kind != KindAcquire || op.Output.Status != StatusOK {
			continue
		}
		end := max(op.Input.Call+op.Input.TTL-Slack, kept[op.Output.Lease])
		if t, ok := released[op.Output.Lease]; ok && t < end {
			end = t
		}
		out[op.Input.Key] = append(out[op.Input.Key], grant{op: op, end: end})
	}
	for _, gs := range out {
		sort.Slice(gs, func(i, j int) bool { return gs[i].op.Output.Token < gs[j].op.Output.Token })
	}
	return out
}

// CheckTokens verifies that fencing tokens per key are unique to a lease
// and strictly increasing in real-time order: an acquire that returned
// before another was called has the smaller token.
func CheckTokens(ops []Op) []string {
	var out []string
	for key, gs := range grants(ops) {
		for i := range gs {
			for j := range gs {
				a, b := gs[i].op, gs[j].op
				if i == j {
					continue
				}
				if a.Output.Token == b.Output.Token && a.Output.Lease != b.Output.Lease && i < j {
					out = append(out, fmt.Sprintf("%s: token %d granted twice: %s to client %d, %s to client %d", key,
						a.Output.Token, a.Output.Lease, a.Client, b.Output.Lease, b.Client))
				}
				if a.Input.Return < b.Input.Call && a.Output.Token >= b.Output.Token {
					out = append(out, fmt.Sprintf("%s: token order: %s (token %d, returned %s) before %s (token %d, called %s)",
						key, a.Output.Lease, a.Output.Token, secs(a.Input.Return), b.Output.Lease, b.Output.Token, secs(b.Input.Call)))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// CheckExclusive verifies that no two leases held a key at once: a lease
// granted later (higher token) was granted only after the earlier lease may
// have ended, and no lease succeeded in anything once a later lease of its
// key had been granted before the operation began.
func CheckExclusive(ops []Op) []string {
	var out []string
	all := grants(ops)
	for key, gs := range all {
		for i := range gs {
			for j := i + 1; j < len(gs); j++ {
				a, b := gs[i], gs[j]
				if b.op.Input.Return < a.end {
					out = append(out, fmt.Sprintf("%s: %s (token %d) granted by %s while %s (token %d) held the key until at least %s",
						key, b.op.Output.Lease, b.op.Output.Token, secs(b.op.Input.Return), a.op.Output.Lease, a.op.Output.Token, secs(a.end)))
				}
			}
		}
	}
	for _, op := range ops {
		// A rollback by a lease that expired is answered from the recorded
		// decision and changes nothing; the model checks it.
		if op.Output.Status != StatusOK || op.Input.Lease == "" || (op.Input.Kind == KindRelease && op.Input.Rollback) {
			continue
		}
		var mine *grant
		gs := all[op.Input.Key]
		for i := range gs {
			if gs[i].op.Output.Lease == op.Input.Lease {
				mine = &gs[i]
			}
		}
		if mine == nil {
			continue
		}
		for _, g := range gs {
			if g.op.Output.Token > mine.op.Output.Token && g.op.Input.Return < op.Input.Call {
				out = append(out, fmt.Sprintf("%s: %s by client %d succeeded at %s after %s (token %d) was granted at %s",
					op.Input.Key, DescribeOp(op.Input, op.Output), op.Client, secs(op.Input.Call), g.op.Output.Lease,
					g.op.Output.Token, secs(g.op.Input.Return)))
				break
			}
		}
	}
	sort.Strings(out)
	return out
}
