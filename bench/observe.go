package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Samples are Prometheus samples by series: the metric name with its
// labels, exactly as exported ("raftlockd_raft_propose_seconds_count").
type Samples map[string]float64

// ParseMetrics reads Prometheus' text exposition format.
func ParseMetrics(r io.Reader) (Samples, error) {
	out := Samples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The value follows the series; an optional timestamp follows it.
		var series string
		var rest []string
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			series, rest = line[:i+1], strings.Fields(line[i+1:])
		} else {
			f := strings.Fields(line)
			series, rest = f[0], f[1:]
		}
		if len(rest) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(rest[0], 64)
		if err != nil {
			continue
		}
		out[series] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: read metrics: %w", err)
	}
	return out, nil
}

// RaftStats is what a raftlockd leader reported over a measurement.
type RaftStats struct {
	// ProposalsPerOp: Raft commands the leader proposed per measured
	// operation (acquire, update, release: one each).
	ProposalsPerOp float64 `json:"proposals_per_op"`
	// ProposeMean: mean time from proposing a command to its result.
	ProposeMean time.Duration `json:"propose_mean_ns"`
	// LogStoreMean: mean time to durably append a batch to the leader's
	// Raft log; EntriesPerStore: proposals (commands) per such batch.
	LogStoreMean    time.Duration `json:"log_store_mean_ns"`
	EntriesPerStore float64       `json:"entries_per_store"`
	// CommandsPerEntry: mean commands per log entry the leader proposed
	// (commands proposed together share one entry); 0 when not reported.
	CommandsPerEntry float64 `json:"commands_per_entry,omitempty"`
	// ApplyBatch: mean entries applied to the state machine per batch.
	ApplyBatch float64 `json:"apply_batch_entries"`
}

// RaftStatsBetween derives RaftStats from a leader's samples before and
// after ops operations; nil when the leader proposed nothing.
func RaftStatsBetween(before, after Samples, ops int64) *RaftStats {
	delta := func(name string) float64 { return after[name] - before[name] }
	mean := func(name string) (time.Duration, float64) {
		n := delta(name + "_count")
		if n <= 0 {
			return 0, 0
		}
		return time.Duration(math.Round(delta(name+"_sum") / n * float64(time.Second))), n
	}
	propose, proposals := mean("raftlockd_raft_propose_seconds")
	if proposals == 0 {
		return nil
	}
	store, stores := mean("raftlockd_raft_log_store_seconds")
	s := &RaftStats{ProposeMean: propose, LogStoreMean: store}
	if ops > 0 {
		s.ProposalsPerOp = proposals / float64(ops)
	}
	if stores > 0 {
		s.EntriesPerStore = proposals / stores
	}
	if n := delta("raftlockd_raft_entry_commands_count"); n > 0 {
		s.CommandsPerEntry = delta("raftlockd_raft_entry_commands_sum") / n
	}
	if n := delta("raftlockd_raft_apply_batch_entries_count"); n > 0 {
		s.ApplyBatch = delta("raftlockd_raft_apply_batch_entries_sum") / n
	}
	return s
}

// String describes the stats in one line.
func (s *RaftStats) String() string {
	return fmt.Sprintf("%.2f Raft proposals per op, propose (replicate + apply) mean %s, leader log append (fsync) mean %s "+
		"for %.1f commands per append, %.1f commands per entry, %.1f entries per apply batch",
		s.ProposalsPerOp, ms(s.ProposeMean), ms(s.LogStoreMean), s.EntriesPerStore, s.CommandsPerEntry, s.ApplyBatch)
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// procCPU is the CPU time (user + system) process pid has used so far.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	return parseProcStat(string(raw))
}

// parseProcStat reads utime and stime from a /proc/<pid>/stat line. The
// command name (field 2) may hold spaces and parentheses, so the fields are
// counted from its closing parenthesis.
func parseProcStat(line string) (time.Duration, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: malformed stat line")
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: short stat line")
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: stat line: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// cpuOf sums the CPU time of pids; processes that are gone count zero.
func cpuOf(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		if d, err := procCPU(p); err == nil {
			sum += d
		}
	}
	return sum
}

// selfCPU is the CPU time this process has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Explain says what bounded a run of a raftlockd cluster on a machine
// with cores cores: how busy the processor was (and, when nearly every core
// was, that throughput is bought with CPU per operation), and the chain of
// Raft commands an operation (for hand-offs: each hand-off) waits for.
func Explain(res Result, cores int) string {
	busy := res.ServerCPU + res.ClientCPU
	var b strings.Builder
	if res.OpsPerSec > 0 && busy > 0 {
		perOp := func(c float64) string { return ms(time.Duration(c / res.OpsPerSec * float64(time.Second))) }
		fmt.Fprintf(&b, "CPU per operation: %s in the servers, %s in the bench client. ", perOp(res.ServerCPU), perOp(res.ClientCPU))
	}
	fmt.Fprintf(&b, "%.2f of %d cores were busy (servers %.2f, bench client %.2f)", busy, cores, res.ServerCPU, res.ClientCPU)
	if busy >= 0.75*float64(cores) {
		b.WriteString(": the processor is (nearly) saturated, so k times the throughput takes operations k times " +
			"cheaper in CPU; the profile's top entries are where the leader spends it. ")
	} else {
		b.WriteString(": the processor is not the limit. ")
	}
	r := res.Raft
	switch {
	case r == nil || r.ProposeMean <= 0:
		b.WriteString("Each operation waits for its Raft commands in sequence.")
	case res.Workload == Handoff && res.OpsPerSec > 0:
		fmt.Fprintf(&b, "Hand-offs are sequential: one completes when the holder's release is committed through Raft "+
			"(the grant to the first waiter is in the same entry); the new holder then learns of its grant and sends "+
			"its own release. At %s per Raft command that allows at most %.0f hand-offs/s; %.0f/s (%s per hand-off) "+
			"were measured. The waiters' acquires, the other Raft command per hand-off, overlap with it.",
			ms(r.ProposeMean), float64(time.Second)/float64(r.ProposeMean), res.OpsPerSec,
			ms(time.Duration(float64(time.Second)/res.OpsPerSec)))
	default:
		fmt.Fprintf(&b, "Each operation waits for %.1f Raft commands in sequence, %s each on the leader (its log "+
			"append with fsync: %s): about %s of the %s p50.", r.ProposalsPerOp, ms(r.ProposeMean), ms(r.LogStoreMean),
			ms(time.Duration(r.ProposalsPerOp*float64(r.ProposeMean))), ms(res.P50))
		if r.EntriesPerStore >= 1.5 {
			fmt.Fprintf(&b, " The leader appends %.1f commands per fsync, so most of a command's time is waiting "+
				"behind the batches before it.", r.EntriesPerStore)
		}
	}
	return b.String()
}
