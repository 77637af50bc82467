package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Goal is one of raftlockd's performance goals against etcd, as measured
// by a comparison.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"` // "" when the comparison lacks the row
	Met      bool   `json:"met"`
	// Profile names the profiled run that explains a miss
	// ("<workload>-<clients>"), "" when a CPU profile would not.
	Profile string `json:"profile,omitempty"`
}

// Goals evaluates raftlockd's goals (3 nodes each, loopback) on c, whose
// first system is raftlockd and second etcd: contended hand-offs among 8
// at least 25x etcd's, lock cycles at 64 clients at least 3x etcd's, a
// single client's lock cycle p50 under 1.5 ms, and every failover round
// under 1 s.
func Goals(c *Comparison) []Goal {
	find := func(w string, clients int) *Row {
		for i := range c.Rows {
			if r := &c.Rows[i]; r.Workload == w && r.Clients == clients && len(r.Results) == 2 {
				return r
			}
		}
		return nil
	}
	versus := func(name, w string, clients int, atLeast float64) Goal {
		g := Goal{Name: name, Target: fmt.Sprintf(">= %sx etcd", trimFloat(atLeast)), Profile: fmt.Sprintf("%s-%d", w, clients)}
		if r := find(w, clients); r != nil {
			f := float64(r.Ratio)
			g.Measured = fmt.Sprintf("%.0f vs %.0f ops/s: %s", r.Results[0].OpsPerSec, r.Results[1].OpsPerSec, FormatRatio(f))
			g.Met = !math.IsNaN(f) && f >= atLeast
		}
		return g
	}
	goals := []Goal{
		versus("contended hand-offs/s, 8 contenders on one key", Handoff, 8, 25),
		versus("lock cycles/s, 64 clients", Lock, 64, 3),
	}
	p50 := Goal{Name: "lock cycle p50, 1 client", Target: "< 1.50ms", Profile: "lock-1"}
	if r := find(Lock, 1); r != nil {
		p50.Measured = fmt.Sprintf("%s (etcd %s)", ms(r.Results[0].P50), ms(r.Results[1].P50))
		p50.Met = r.Results[0].Ops > 0 && r.Results[0].P50 < 1500*time.Microsecond
	}
	fo := Goal{Name: "failover: leader SIGKILL -> first acknowledged write", Target: "< 1s, every round"}
	if len(c.Systems) > 0 {
		if ds := c.Failovers[c.Systems[0]]; len(ds) > 0 {
			fo.Measured = Summarize(ds)
			if len(c.Systems) > 1 {
				if es := c.Failovers[c.Systems[1]]; len(es) > 0 {
					fo.Measured += fmt.Sprintf(" (etcd: median %s)", ms(median(es)))
				}
			}
			fo.Met = slices.Max(ds) < time.Second
		}
	}
	return append(goals, p50, fo)
}

func trimFloat(f float64) string { return strings.TrimSuffix(fmt.Sprintf("%g", f), ".0") }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return percentile(s, 0.5)
}

// verdict is a goal's outcome in words.
func (g Goal) verdict() string {
	switch {
	case g.Measured == "":
		return "not measured"
	case g.Met:
		return "met"
	default:
		return "**missed**"
	}
}

// WriteGoalsMarkdown prints the goals as a Markdown table.
func WriteGoalsMarkdown(w io.Writer, goals []Goal) {
	fmt.Fprintln(w, "| goal | target | measured (raftlockd vs etcd) | verdict |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, g := range goals {
		m := g.Measured
		if m == "" {
			m = "-"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", g.Name, g.Target, m, g.verdict())
	}
}

// WriteGoalsTable prints the goals as plain lines.
func WriteGoalsTable(w io.Writer, goals []Goal) {
	for _, g := range goals {
		m := g.Measured
		if m == "" {
			m = "-"
		}
		fmt.Fprintf(w, "goal %s (%s): %s: %s\n", g.Name, g.Target, m, strings.Trim(g.verdict(), "*"))
	}
}

// WriteMissed prints one line per missed goal: the profile that explains
// it ("-" when none does), a tab, and the goal's name.
func WriteMissed(w io.Writer, goals []Goal) {
	for _, g := range goals {
		if g.Measured != "" && !g.Met {
			p := g.Profile
			if p == "" {
				p = "-"
			}
			fmt.Fprintf(w, "%s\t%s\n", p, g.Name)
		}
	}
}

// WriteReferenceMarkdown lists the etcd figures the goals were set against (measured
// on this kind of machine, 3 members, loopback) next to this run's.
func WriteReferenceMarkdown(w io.Writer, c *Comparison) {
	if len(c.Systems) < 2 {
		return
	}
	measured := func(wl string, clients int) string {
		for _, r := range c.Rows {
			if r.Workload == wl && r.Clients == clients && len(r.Results) == 2 {
				return fmt.Sprintf("%.0f/s", r.Results[1].OpsPerSec)
			}
		}
		return "-"
	}
	fo := "-"
	if es := c.Failovers[c.Systems[1]]; len(es) > 0 {
		fo = "median " + ms(median(es))
	}
	fmt.Fprintln(w, "| etcd figure | reference | this run |")
	fmt.Fprintln(w, "|---|---:|---:|")
	fmt.Fprintf(w, "| lock cycles, 1 client | ~400/s | %s |\n", measured(Lock, 1))
	fmt.Fprintf(w, "| contended hand-offs, 8 contenders | ~80/s | %s |\n", measured(Handoff, 8))
	fmt.Fprintf(w, "| plain puts, 64 clients | ~6,900/s | %s |\n", measured(Put, 64))
	fmt.Fprintf(w, "| failover | ~2.1s | %s |\n", fo)
}
