package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/wire"
)

func backendHash(t *testing.T, srv *serverProc) string {
	t.Helper()
	var st wire.ClusterStatusResponse
	if err := json.Unmarshal([]byte(mustCLI(t, srv.clientEnv(), "", "cluster", "status", "--format", "json")), &st); err != nil ||
		st.BackendHash == "" {
		t.Fatalf("status of %s: %+v %v", srv.url, st, err)
	}
	return st.BackendHash
}

func TestParseParticipant(t *testing.T) {
	for in, want := range map[string]wire.TxnParticipant{
		"k":                 {Key: "k"},
		"ns:k":              {Namespace: "ns", Key: "k"},
		"ns:k@h":            {Namespace: "ns", Key: "k", BackendHash: "h"},
		"k@h":               {Key: "k", BackendHash: "h"},
		"ns:a:b@h":          {Namespace: "ns", Key: "a:b", BackendHash: "h"},
		"orders/42@7f3a9c0": {Key: "orders/42", BackendHash: "7f3a9c0"},
	} {
		got, err := parseParticipant(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ns:", "@h", "ns:@h"} {
		if _, err := parseParticipant(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// TestCLITransactionAcrossIslands runs two islands as real server
// processes, each with the CA it created for itself, makes each trust the
// other's CA, and commits one transaction over both from the shell.
// Commands reach island B with B's bundles (RAFTLOCKD_DATA_DIR of B).
func TestCLITransactionAcrossIslands(t *testing.T) {
	t.Parallel()
	a, b := newServer(t), newServer(t)
	ha, hb := backendHash(t, a), backendHash(t, b)
	env := a.clientEnv("A="+a.url, "B="+b.url, "HA="+ha, "HB="+hb, "ADIR="+a.dataDir, "BDIR="+b.dataDir)
	out := bash(t, env, `
raftlockd tc trust add "$BDIR/tls/ca.pem" --name island-b >/dev/null
RAFTLOCKD_DATA_DIR=$BDIR raftlockd tc trust add --server "$B" "$ADIR/tls/ca.pem" --name island-a >/dev/null
raftlockd tc rm register --backend-hash "$HB" --endpoint "$B" >/dev/null
RAFTLOCKD_DATA_DIR=$BDIR raftlockd tc rm register --server "$B" --backend-hash "$HA" --endpoint "$A" >/dev/null
echo "ISLANDS=$(raftlockd tc rm list | tr '\n\t' '  ')"
eval "$(raftlockd client acquire --key a)"
echo '{"v":"a"}' | raftlockd client update >/dev/null
eval "$(RAFTLOCKD_DATA_DIR=$BDIR raftlockd client acquire --server "$B" --key b)"
echo '{"v":"b"}' | RAFTLOCKD_DATA_DIR=$BDIR raftlockd client update --server "$B" >/dev/null
echo "TXN=$RAFTLOCKD_CLIENT_TXN_ID"
raftlockd txn commit --participant default:a --participant "default:b@$HB" --format json | tr -d ' \n'; echo
echo "A=$(raftlockd client get --public --key a)"
echo "B=$(RAFTLOCKD_DATA_DIR=$BDIR raftlockd client get --public --server "$B" --key b)"
raftlockd txn status
echo "RM=$(RAFTLOCKD_DATA_DIR=$BDIR raftlockd txn status --server "$B" --format json | tr -d ' \n')"
`)
	v := parseLines(out)
	if !strings.Contains(strings.Join(strings.Fields(v["ISLANDS"]), " "), hb+" "+b.url) {
		t.Fatalf("registry: %q", out)
	}
	wantJSON(t, "a after commit", v["A"], `{"v":"a"}`)
	wantJSON(t, "b after commit", v["B"], `{"v":"b"}`)
	if !strings.Contains(out, `"state":"commit"`) || !strings.Contains(strings.Join(strings.Fields(out), " "), "applied "+hb) {
		t.Fatalf("commit and status output: %s", out)
	}
	if !strings.Contains(v["RM"], `"tc_backend_hash":"`+ha+`"`) || !strings.Contains(v["RM"], `"state":"commit"`) {
		t.Fatalf("the resource manager's record: %s", v["RM"])
	}
	// A decided transaction cannot be rolled back, and a conflict is an
	// error exit with the stable code.
	res := cli(t, a.clientEnv(), "", "txn", "rollback", "--txn-id", v["TXN"])
	if res.code == 0 || !strings.Contains(res.stderr, "txn_committed") {
		t.Fatalf("rollback after commit: exit %d, %s", res.code, res.stderr)
	}
	res = cli(t, a.clientEnv(), "", "txn", "commit", "--txn-id", v["TXN"], "--participant", "@bad")
	if res.code == 0 {
		t.Fatalf("a malformed participant must fail: %s", res.stdout)
	}
}
