package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/rs/xid"

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

// TestCLIPrepareReplayRemoveAndEnlistedDequeue runs the transaction
// commands of one island from bash: a staged remove, a prepare that meets a
// key held by another owner (a final failure, answered again from the
// record), prepare + commit + replay, dequeues enlisted in a transaction
// (rolled back, then committed by their ack) and an RM registration
// removed again.
func TestCLIPrepareReplayRemoveAndEnlistedDequeue(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv("TMPDIR="+t.TempDir()), `
# Forget the lease and delivery variables (not the server).
fresh() {
  for v in $(compgen -v RAFTLOCKD_CLIENT_) $(compgen -v RAFTLOCKD_QUEUE_); do
    [ "$v" = RAFTLOCKD_CLIENT_SERVER ] || unset "$v"
  done
}

eval "$(raftlockd client acquire --key doc)"
echo '{"x":1}' | raftlockd client update >/dev/null
eval "$(raftlockd client release)"
eval "$(raftlockd client acquire --key doc)"
raftlockd client remove >/dev/null
echo "BEFORE_RELEASE=$(raftlockd client get --public --key doc | tr -d ' \n')"
eval "$(raftlockd client release)"
echo "REMOVED=$(raftlockd client get --public --key doc)"
fresh

raftlockd client acquire --key busy --owner alice >/dev/null
eval "$(raftlockd client acquire --key mine --owner bob)"
for i in 1 2; do
  if raftlockd txn prepare --owner bob --participant default:mine --participant default:busy 2>"$TMPDIR/err"; then
    echo "CONFLICT$i=prepared"
  else
    echo "CONFLICT$i=$(tr -d '\n' < "$TMPDIR/err")"
  fi
done
echo "CONFLICT_STATE=$(raftlockd txn status --format json | tr -d ' \n')"
fresh

eval "$(raftlockd client acquire --key p)"
echo '{"p":1}' | raftlockd client update >/dev/null
echo "PREPARED=$(raftlockd txn prepare --participant default:p --format json | tr -d ' \n')"
echo "PENDING_PUBLIC=$(raftlockd client get --public --key p)"
echo "COMMITTED=$(raftlockd txn commit --participant default:p --format json | tr -d ' \n')"
echo "REPLAYED=$(raftlockd txn replay --format json | tr -d ' \n')"
echo "P=$(raftlockd client get --public --key p | tr -d ' \n')"
fresh

printf 'job' | raftlockd client queue enqueue --queue work >/dev/null
eval "$(raftlockd client acquire --key anchor)"
eval "$(raftlockd client queue dequeue --queue work --wait -1 --txn-id "$RAFTLOCKD_CLIENT_TXN_ID")"
echo "ENLISTED=$RAFTLOCKD_QUEUE_MESSAGE_ID"
raftlockd txn rollback >/dev/null
echo "AFTER_ROLLBACK=$(raftlockd client queue stats --queue work | tr -d ' \n')"
fresh
eval "$(raftlockd client acquire --key anchor)"
T=$RAFTLOCKD_CLIENT_TXN_ID
eval "$(raftlockd client queue dequeue --queue work --wait -1 --txn-id "$T")"
eval "$(raftlockd client queue ack)"
echo "ACKED=$(raftlockd txn status --txn-id "$T" --format json | tr -d ' \n')"
echo "AFTER_ACK=$(raftlockd client queue stats --queue work | tr -d ' \n')"
fresh

raftlockd tc rm register --backend-hash feedface --endpoint "$RAFTLOCKD_CLIENT_SERVER" >/dev/null
echo "REGISTERED=$(raftlockd tc rm list | grep -c feedface)"
raftlockd tc rm unregister --backend-hash feedface --endpoint "$RAFTLOCKD_CLIENT_SERVER" >/dev/null
echo "UNREGISTERED=$(raftlockd tc rm list | grep -c feedface)"
`)
	v := parseLines(out)
	wantJSON(t, "doc before the removal commits", v["BEFORE_RELEASE"], `{"x":1}`)
	if v["REMOVED"] != "" {
		t.Errorf("doc after the removal committed: %q", v["REMOVED"])
	}
	for _, k := range []string{"CONFLICT1", "CONFLICT2"} {
		if !strings.Contains(v[k], "txn_lock_conflict") || !strings.Contains(v[k], "LOCKED:alice") {
			t.Errorf("%s = %q, want txn_lock_conflict naming LOCKED:alice", k, v[k])
		}
	}
	if !strings.Contains(v["CONFLICT_STATE"], `"state":"rollback"`) {
		t.Errorf("the conflict must be recorded as a rollback: %s", v["CONFLICT_STATE"])
	}
	for k, want := range map[string]string{"PREPARED": `"state":"pending"`, "COMMITTED": `"state":"commit"`,
		"REPLAYED": `"state":"commit"`, "ACKED": `"state":"commit"`} {
		if !strings.Contains(v[k], want) {
			t.Errorf("%s = %q, want %s", k, v[k], want)
		}
	}
	if v["PENDING_PUBLIC"] != "" {
		t.Errorf("a prepared write is visible: %q", v["PENDING_PUBLIC"])
	}
	wantJSON(t, "p after commit", v["P"], `{"p":1}`)
	if v["ENLISTED"] == "" || !strings.Contains(v["AFTER_ROLLBACK"], `"available":true`) {
		t.Errorf("rollback must return the message: %q %s", v["ENLISTED"], v["AFTER_ROLLBACK"])
	}
	if !strings.Contains(v["AFTER_ACK"], `"available":false`) {
		t.Errorf("the ack must commit and remove the message: %s", v["AFTER_ACK"])
	}
	if v["REGISTERED"] != "1" || v["UNREGISTERED"] != "0" {
		t.Errorf("registry: %q then %q (output:\n%s)", v["REGISTERED"], v["UNREGISTERED"], out)
	}
}

// A negative --expires is refused before anything is sent, rather than
// taken for the server's default.
func TestCLITxnPrepareRefusesANegativeExpiry(t *testing.T) {
	t.Parallel()
	res := cli(t, nil, "", "txn", "prepare", "--server", "http://127.0.0.1:1", "--txn-id", xid.New().String(),
		"--participant", "k", "--expires", "-5s")
	if res.code == 0 || !strings.Contains(res.stderr, "--expires") {
		t.Fatalf("exit %d, stderr %q; want a refusal naming --expires", res.code, res.stderr)
	}
}

// Every txn command needs a transaction id, and says so before anything is
// sent rather than passing "" to the server to be refused as no xid.
func TestCLITxnCommandsNeedATxnID(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"prepare", "commit", "rollback", "replay", "status"} {
		res := cli(t, nil, "", "txn", sub, "--server", "http://127.0.0.1:1")
		if res.code != 1 || !strings.Contains(res.stderr, "--txn-id is required") {
			t.Errorf("txn %s without --txn-id: exit %d, stderr %q; want a refusal naming --txn-id", sub, res.code, res.stderr)
		}
	}
}

// RAFTLOCKD_CLIENT_PARTICIPANT stands for several --participant flags: a
// comma-separated list (spaces after a comma do not count), in which a
// participant whose key holds a comma is quoted as in CSV. A list that does not read is refused, naming it.
func TestCLIParticipantsFromTheEnvironment(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	env := srv.clientEnv("RAFTLOCKD_CLIENT_TXN_ID="+xid.New().String(), `RAFTLOCKD_CLIENT_PARTICIPANT=default:a, "default:b,c"`)
	mustCLI(t, env, "", "txn", "prepare")
	var st wire.TxnStatusResponse
	if err := json.Unmarshal([]byte(mustCLI(t, env, "", "txn", "status", "--format", "json")), &st); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, p := range st.Participants {
		keys = append(keys, p.Namespace+":"+p.Key)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"default:a", "default:b,c"}) {
		t.Errorf("participants %q, want default:a and default:b,c", keys)
	}
	mustCLI(t, env, "", "txn", "rollback")

	res := cli(t, srv.clientEnv("RAFTLOCKD_CLIENT_TXN_ID="+xid.New().String(), `RAFTLOCKD_CLIENT_PARTICIPANT=a"b`), "", "txn", "prepare")
	if res.code != 1 || !strings.Contains(res.stderr, "RAFTLOCKD_CLIENT_PARTICIPANT") {
		t.Errorf("a participant list that is not CSV: exit %d, stderr %q; want a refusal naming the variable", res.code, res.stderr)
	}
}
