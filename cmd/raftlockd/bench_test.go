package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/internal/lockedbuf"
	"github.com/raftlockd/raftlockd/internal/testutil"
)

// TestBenchEmbeddedWorkloads runs the workloads added for the comparison
// with etcd against an embedded server and reads the JSON report.
func TestBenchEmbeddedWorkloads(t *testing.T) {
	out := mustCLI(t, nil, "", "bench", "--embedded", "--runs", "public-read=2 put=2 queue=1 utxo-spend=2 utxo-create=2",
		"--ops", "10", "--warmup", "0s", "--utxo-parent-outputs", "4", "--format", "json")
	var rep struct {
		Results []struct {
			Workload string `json:"workload"`
			Clients  int    `json:"clients"`
			Ops      int64  `json:"ops"`
			Errors   int64  `json:"errors"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rep.Results) != 5 {
		t.Fatalf("results: %s", out)
	}
	for i, w := range []string{"public-read", "put", "queue", "utxo-spend", "utxo-create"} {
		r := rep.Results[i]
		if r.Workload != w || r.Ops != 10 || r.Errors != 0 {
			t.Fatalf("result %d: %+v, want %s with 10 ops and no errors", i, r, w)
		}
	}
	// Without rows asked for, the lock cycle alone and with 64 clients and a
	// hand-off contended by 8.
	out = mustCLI(t, nil, "", "bench", "--embedded", "--ops", "64", "--warmup", "0s", "--format", "json")
	rep.Results = nil
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var rows []string
	for _, r := range rep.Results {
		rows = append(rows, fmt.Sprintf("%s=%d", r.Workload, r.Clients))
	}
	if got := strings.Join(rows, " "); got != "lock=1 lock=64 handoff=8" {
		t.Fatalf("default rows %q, want lock=1 lock=64 handoff=8", got)
	}
	if res := cli(t, nil, "", "bench", "--embedded", "--peer", "etcd"); res.code == 0 || !strings.Contains(res.stderr, "--peer needs --spawn") {
		t.Fatalf("--peer without --spawn: exit %d, %s", res.code, res.stderr)
	}
	// etcd has no UTXO records: refused before anything starts.
	if res := cli(t, nil, "", "bench", "--spawn", "3", "--peer", "etcd", "--runs", "lock=1 utxo-spend=1"); res.code == 0 ||
		!strings.Contains(res.stderr, "--peer etcd: etcd does not run utxo-spend") {
		t.Fatalf("--peer etcd with utxo-spend: exit %d, %s", res.code, res.stderr)
	}
}

// TestBenchSideBySideWithEtcd runs the side-by-side mode with one node of
// each system (the etcd binary on PATH; Debian: etcd-server).
func TestBenchSideBySideWithEtcd(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("SKIPPED: no etcd binary on PATH (apt-get install etcd-server): the side-by-side mode is not exercised")
	}
	out := mustCLI(t, nil, "", "bench", "--spawn", "1", "--peer", "etcd", "--runs", "lock=1 handoff=2", "--rounds", "2",
		"--ops", "10", "--warmup", "0s", "--format", "json")
	var cmp struct {
		Systems []string `json:"systems"`
		Rows    []struct {
			Workload    string     `json:"workload"`
			Ratio       *float64   `json:"ratio"`
			RoundRatios []*float64 `json:"round_ratios"`
			Rounds      [][]struct {
				Ops int64 `json:"ops"`
			} `json:"rounds"`
		} `json:"rows"`
		Goals []struct {
			Name string `json:"name"`
		} `json:"goals"`
	}
	if err := json.Unmarshal([]byte(out), &cmp); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Join(cmp.Systems, ",") != "raftlockd,etcd" || len(cmp.Rows) != 2 || len(cmp.Goals) != 4 {
		t.Fatalf("comparison: %s", out)
	}
	for _, r := range cmp.Rows {
		if r.Ratio == nil || *r.Ratio <= 0 || len(r.RoundRatios) != 2 || len(r.Rounds) != 2 {
			t.Fatalf("row %s: %s", r.Workload, out)
		}
		for _, rounds := range r.Rounds {
			for _, res := range rounds {
				if res.Ops != 10 {
					t.Fatalf("row %s: a run with %d ops: %s", r.Workload, res.Ops, out)
				}
			}
		}
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name: state, ppid, ...
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// TestBenchInterruptedCleansUp interrupts a bench of a spawned cluster
// (Ctrl-C while it measures, SIGTERM from a supervisor while the cluster
// starts): it stops the servers it started and removes their temporary
// directory before it exits.
func TestBenchInterruptedCleansUp(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: the bench's server processes cannot be found")
	}
	for _, c := range []struct {
		sig       syscall.Signal
		measuring bool // signal once a run is done and the next measures, else once the server process exists
	}{{syscall.SIGINT, true}, {syscall.SIGTERM, false}} {
		t.Run(c.sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(testutil.Binary(t), "bench", "--spawn", "1", "--dir", dir, "--runs", "lock=1",
				"--rounds", "1000", "--duration", "1s", "--warmup", "0s")
			cmd.Env = baseEnv(t)
			var out lockedbuf.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			var servers []int
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
				for _, pid := range servers {
					if running(pid) {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			})
			testutil.WaitFor(t, 30*time.Second, "the bench to start its server", func() bool {
				servers = childrenOf(cmd.Process.Pid)
				return len(servers) == 1
			})
			if c.measuring {
				testutil.WaitFor(t, 30*time.Second, "a finished run", func() bool { return strings.Contains(out.String(), "done: round 1 ") })
			}
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("the bench did not end within 30s of %s: %s", c.sig, out.String())
			}
			testutil.WaitFor(t, 10*time.Second, "the server to end", func() bool { return !running(servers[0]) })
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Fatalf("left in --dir after %s: %v (%s)", c.sig, left, out.String())
			}
			if !strings.Contains(out.String(), "bench: interrupted") {
				t.Errorf("after %s: %s", c.sig, out.String())
			}
		})
	}
}

// TestBenchRefusesFlagsItWouldIgnore: a flag that would not take effect,
// or would describe another system than the one measured, is refused
// before anything starts.
func TestBenchRefusesFlagsItWouldIgnore(t *testing.T) {
	short := []string{"--runs", "lock=1", "--ops", "1", "--warmup", "0s"}
	for _, c := range []struct {
		args []string
		want string
	}{
		// Ignored: no cluster to kill the leader of.
		{[]string{"--embedded", "--failover-rounds", "1"}, "--failover-rounds needs --spawn 3"},
		// The embedded server is measured, the spawned cluster's CPU reported and its leader killed.
		{[]string{"--spawn", "1", "--embedded"}, "--spawn and --embedded"},
		{[]string{"--spawn", "1", "--islands", "2"}, "--islands needs --embedded"},
		{[]string{"--embedded", "--goals-out", filepath.Join(t.TempDir(), "missed.txt")}, "--goals-out needs --peer"},
		// etcd is never started.
		{[]string{"--spawn", "1", "--peer", "etcd", "--blocks", "10x1"}, "--blocks measures raftlockd alone"},
		// The only node, or one of two, killed: no write is ever acknowledged (a 30s wait, then an
		// error).
		{[]string{"--spawn", "1", "--failover-rounds", "1"}, "--failover-rounds needs --spawn 3"},
	} {
		args := append(append([]string{"bench"}, c.args...), short...)
		res := cli(t, nil, "", args...)
		if res.code == 0 || !strings.Contains(res.stderr, c.want) {
			t.Errorf("%s: exit %d, want an error %q\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.code, c.want, res.stdout, res.stderr)
		}
	}
}
