package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
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
