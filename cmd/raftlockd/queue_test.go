package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/wire"
)

// TestCLIQueue drives the queue commands from bash the way an operator
// would: enqueue from stdin and from a file, eval dequeue, ack, nack and
// extend from the exported environment.
func TestCLIQueue(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv("TMPDIR="+t.TempDir()), `
printf 'hello queue' | raftlockd client queue enqueue --queue jobs --attributes '{"k":1}' --content-type text/plain >/dev/null
printf 'second' > "$TMPDIR/p2"
raftlockd client queue enqueue --queue jobs "$TMPDIR/p2" >/dev/null
eval "$(raftlockd client queue dequeue --queue jobs --wait -1)"
echo "PAYLOAD=$(cat "$RAFTLOCKD_QUEUE_PAYLOAD_FILE")"
for v in NAMESPACE NAME MESSAGE_ID LEASE FENCING_TOKEN ATTEMPTS CONTENT_TYPE PAYLOAD_BYTES; do
  n="RAFTLOCKD_QUEUE_$v"; echo "$v=${!n}"
done
raftlockd client queue extend --by 60s | sed 's/^export RAFTLOCKD_QUEUE_/EXTENDED_/'
eval "$(raftlockd client queue ack)"
echo "CLEARED=${RAFTLOCKD_QUEUE_LEASE:-none}/${RAFTLOCKD_QUEUE_MESSAGE_ID:-none}"

eval "$(raftlockd client queue dequeue --queue jobs --wait 5s --payload-file "$TMPDIR/out")"
echo "SECOND=$(cat "$TMPDIR/out") FILE=$RAFTLOCKD_QUEUE_PAYLOAD_FILE"
raftlockd client queue nack --defer >/dev/null
# The variables still name the delivery nack handed back: a stale lease.
if raftlockd client queue ack 2>"$TMPDIR/err"; then echo "STALE=accepted"; else echo "STALE=$(cat "$TMPDIR/err")"; fi
echo "STATS=$(raftlockd client queue stats --queue jobs | tr -d '\n')"
eval "$(raftlockd client queue dequeue --queue jobs --wait -1)"
echo "AGAIN=$(cat "$RAFTLOCKD_QUEUE_PAYLOAD_FILE") ATTEMPTS=$RAFTLOCKD_QUEUE_ATTEMPTS FAILURES=$RAFTLOCKD_QUEUE_FAILURE_ATTEMPTS"
raftlockd client queue nack --last-error 'disk full' 2>/dev/null >/dev/null
eval "$(raftlockd client queue dequeue --queue jobs --wait -1)"
echo "FAILED_ONCE=$RAFTLOCKD_QUEUE_FAILURE_ATTEMPTS"
eval "$(raftlockd client queue ack)"
if raftlockd client queue dequeue --queue jobs --wait -1 >/dev/null 2>"$TMPDIR/err"; then echo "EMPTY=delivered"; else echo "EMPTY=$(cat "$TMPDIR/err")"; fi

# A stateful delivery: the sidecar is updated like any key, kept by nack.
printf 'flow' | raftlockd client queue enqueue --queue flows >/dev/null
eval "$(raftlockd client queue dequeue --queue flows --wait -1 --with-state)"
echo "STATE_KEY=$RAFTLOCKD_QUEUE_STATE_KEY"
echo "STATE_BEFORE=$(cat "$RAFTLOCKD_QUEUE_STATE_FILE")"
echo '{"step":1}' | raftlockd client update --queue-state >/dev/null
echo "STATE_STAGED=$(raftlockd client get --queue-state)"
echo "STATE_KEEPALIVE=$(raftlockd client keepalive --queue-state --ttl 60s)"
eval "$(raftlockd client queue nack --defer)"
eval "$(raftlockd client queue dequeue --queue flows --wait -1 --with-state)"
echo "STATE_AFTER=$(cat "$RAFTLOCKD_QUEUE_STATE_FILE")"
echo '{"step":2}' | raftlockd client update --key "$RAFTLOCKD_QUEUE_STATE_KEY" --lease "$RAFTLOCKD_QUEUE_STATE_LEASE" \
  --txn-id "$RAFTLOCKD_QUEUE_STATE_TXN_ID" --fencing-token "$RAFTLOCKD_QUEUE_STATE_FENCING_TOKEN" >/dev/null
eval "$(raftlockd client queue ack)"
if echo '{}' | raftlockd client update --queue-state >/dev/null 2>"$TMPDIR/err"; then echo "NO_SIDECAR=updated"; else echo "NO_SIDECAR=$(cat "$TMPDIR/err")"; fi

# Transactions: an enqueue joins the shell's transaction and appears when it commits.
eval "$(raftlockd client acquire --key k)"
printf 'staged' | raftlockd client queue enqueue --queue tx >/dev/null
if raftlockd client queue dequeue --queue tx --wait -1 >/dev/null 2>&1; then echo "BEFORE_COMMIT=delivered"; else echo "BEFORE_COMMIT=waiting"; fi
eval "$(raftlockd client release)"
eval "$(raftlockd client queue dequeue --queue tx --wait -1)"
echo "COMMITTED=$(cat "$RAFTLOCKD_QUEUE_PAYLOAD_FILE")"
eval "$(raftlockd client queue ack)"
# ack and nack removed the files dequeue wrote, but not a --payload-file.
echo "LEFT=$(ls "$TMPDIR" | grep -c '^raftlockd-') KEPT=$(cat "$TMPDIR/out")"
`)
	v := parseLines(out)
	for name, want := range map[string]string{"PAYLOAD": "hello queue", "NAMESPACE": "default", "NAME": "jobs",
		"FENCING_TOKEN": "1", "ATTEMPTS": "1", "CONTENT_TYPE": "text/plain", "PAYLOAD_BYTES": "11",
		"CLEARED": "none/none", "AGAIN": "second ATTEMPTS=2 FAILURES=0", "FAILED_ONCE": "1",
		"STATE_BEFORE": "", "STATE_STAGED": `{"step":1}`, "STATE_AFTER": `{"step":1}`,
		"BEFORE_COMMIT": "waiting", "COMMITTED": "staged", "LEFT": "0 KEPT=second"} {
		if v[name] != want {
			t.Errorf("%s = %q, want %q (output:\n%s)", name, v[name], want, out)
		}
	}
	if v["MESSAGE_ID"] == "" || v["LEASE"] == "" || v["EXTENDED_LEASE_EXPIRES_AT"] == "" {
		t.Errorf("delivery variables missing: %v", v)
	}
	if !strings.HasPrefix(v["SECOND"], "second FILE=") || !strings.HasSuffix(v["SECOND"], "/out") {
		t.Errorf("SECOND = %q", v["SECOND"])
	}
	if !strings.Contains(v["STALE"], "queue_message_lease_mismatch") {
		t.Errorf("ack of a handed-back delivery: %q", v["STALE"])
	}
	if v["STATE_KEEPALIVE"] != "" {
		// Not RAFTLOCKD_CLIENT_EXPIRES_AT: that is the key lease's of the shell.
		t.Errorf("keepalive --queue-state printed %q, want nothing", v["STATE_KEEPALIVE"])
	}
	if !strings.Contains(v["NO_SIDECAR"], "--queue-state: no state sidecar named") {
		t.Errorf("update --queue-state after the ack: %q", v["NO_SIDECAR"])
	}
	if !strings.Contains(v["EMPTY"], "waiting") {
		t.Errorf("dequeue of an empty queue: %q", v["EMPTY"])
	}
	if !strings.HasPrefix(v["STATE_KEY"], "q/flows/state/") || len(v["STATE_KEY"]) == len("q/flows/state/") {
		t.Errorf("state key %q", v["STATE_KEY"])
	}
	var st wire.QueueStatsResponse
	if err := json.Unmarshal([]byte(v["STATS"]), &st); err != nil || st.Queue != "jobs" || st.Ready != 1 || !st.Available {
		t.Errorf("stats %q: %+v %v", v["STATS"], st, err)
	}
}

// A delivery whose payload the command cannot write is handed back to the
// queue without spending an attempt, so the next consumer gets it at once
// instead of after its visibility timeout.
func TestCLIDequeueHandsBackWhatItCannotWrite(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv("TMPDIR="+t.TempDir()), `
printf 'kept' | raftlockd client queue enqueue --queue back >/dev/null
if raftlockd client queue dequeue --queue back --wait -1 --payload-file "$TMPDIR/missing/dir/p" >/dev/null 2>"$TMPDIR/err"; then
  echo "FIRST=written"
else
  echo "FIRST=$(tr -d '\n' < "$TMPDIR/err")"
fi
eval "$(raftlockd client queue dequeue --queue back --wait -1)"
echo "AGAIN=$(cat "$RAFTLOCKD_QUEUE_PAYLOAD_FILE") FAILURES=$RAFTLOCKD_QUEUE_FAILURE_ATTEMPTS"
eval "$(raftlockd client queue ack)"
`)
	v := parseLines(out)
	if !strings.Contains(v["FIRST"], "was handed back to the queue") {
		t.Errorf("dequeue into a missing directory: %q", v["FIRST"])
	}
	if v["AGAIN"] != "kept FAILURES=0" {
		t.Errorf("the next dequeue: %q (output:\n%s)", v["AGAIN"], out)
	}
}

// An ack or nack of a delivery enlisted in the shell's transaction ends
// that transaction (commit or rollback), so eval of its output clears the
// lease variables too and the next acquire starts a new transaction. A
// delivery outside the shell's transaction leaves them.
func TestCLIAckOfAnEnlistedDeliveryEndsTheShellsTransaction(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv("TMPDIR="+t.TempDir()), `
for p in a b c; do printf "$p" | raftlockd client queue enqueue --queue work >/dev/null; done
eval "$(raftlockd client acquire --key anchor)"
FIRST=$RAFTLOCKD_CLIENT_TXN_ID
eval "$(raftlockd client queue dequeue --queue work --wait -1)"   # enlisted through RAFTLOCKD_CLIENT_TXN_ID
echo "ENLISTED=$([ "$RAFTLOCKD_QUEUE_TXN_ID" = "$FIRST" ] && echo yes)"
eval "$(raftlockd client queue ack)"
echo "AFTER_ACK=${RAFTLOCKD_CLIENT_LEASE:-none}/${RAFTLOCKD_CLIENT_TXN_ID:-none}/${RAFTLOCKD_CLIENT_FENCING_TOKEN:-none}"
echo "FIRST_STATE=$(raftlockd txn status --txn-id "$FIRST" --format json | tr -d ' \n')"

eval "$(raftlockd client acquire --key anchor --block=-1)"
SECOND=$RAFTLOCKD_CLIENT_TXN_ID
echo "NEW_TXN=$([ "$SECOND" != "$FIRST" ] && echo yes)"
eval "$(raftlockd client queue dequeue --queue work --wait -1)"
eval "$(raftlockd client queue nack --defer)"
echo "AFTER_NACK=${RAFTLOCKD_CLIENT_LEASE:-none}/${RAFTLOCKD_CLIENT_TXN_ID:-none}/${RAFTLOCKD_CLIENT_FENCING_TOKEN:-none}"
echo "SECOND_STATE=$(raftlockd txn status --txn-id "$SECOND" --format json | tr -d ' \n')"

eval "$(raftlockd client acquire --key anchor --block=-1)"
THIRD=$RAFTLOCKD_CLIENT_TXN_ID
eval "$(raftlockd client queue dequeue --queue work --wait -1 --txn-id '')"   # not enlisted
eval "$(raftlockd client queue ack)"
echo "KEPT=$([ "${RAFTLOCKD_CLIENT_TXN_ID:-}" = "$THIRD" ] && [ -n "${RAFTLOCKD_CLIENT_LEASE:-}" ] && echo yes)"
eval "$(raftlockd client release)"
`)
	v := parseLines(out)
	for name, want := range map[string]string{"ENLISTED": "yes", "AFTER_ACK": "none/none/none", "NEW_TXN": "yes",
		"AFTER_NACK": "none/none/none", "KEPT": "yes"} {
		if v[name] != want {
			t.Errorf("%s = %q, want %q (output:\n%s)", name, v[name], want, out)
		}
	}
	if !strings.Contains(v["FIRST_STATE"], `"state":"commit"`) || !strings.Contains(v["SECOND_STATE"], `"state":"rollback"`) {
		t.Errorf("the ack must commit the first transaction and the nack roll the second back: %s, %s",
			v["FIRST_STATE"], v["SECOND_STATE"])
	}
}

// eval of a release, an ack or a nack that ended what the flags named, in
// a shell holding another lease or delivery in its variables, leaves
// those variables alone: the shell still holds that lease or delivery,
// which it could otherwise neither release nor acknowledge.
func TestCLIEndingWhatTheFlagsNameKeepsTheShellsOwn(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	out := bash(t, srv.clientEnv("TMPDIR="+t.TempDir()), `
for p in a b; do printf "$p" | raftlockd client queue enqueue --queue jobs >/dev/null; done
eval "$(raftlockd client acquire --key mine)"
echo '{"mine":1}' | raftlockd client update >/dev/null
other=$(env -u RAFTLOCKD_CLIENT_TXN_ID raftlockd client acquire --key theirs)
OTHER_LEASE=$(eval "$other"; echo "$RAFTLOCKD_CLIENT_LEASE") OTHER_TXN=$(eval "$other"; echo "$RAFTLOCKD_CLIENT_TXN_ID")
eval "$(raftlockd client release --key theirs --lease "$OTHER_LEASE" --txn-id "$OTHER_TXN")"
echo "LEASE_KEPT=$([ -n "${RAFTLOCKD_CLIENT_LEASE:-}" ] && [ -n "${RAFTLOCKD_CLIENT_TXN_ID:-}" ] && echo yes)"
eval "$(raftlockd client release)"
echo "MINE=$(raftlockd client get --key mine)"

eval "$(raftlockd client queue dequeue --queue jobs --wait -1)"
FIRST_ID=$RAFTLOCKD_QUEUE_MESSAGE_ID FIRST_LEASE=$RAFTLOCKD_QUEUE_LEASE
eval "$(raftlockd client queue dequeue --queue jobs --wait -1)"
SECOND_ID=$RAFTLOCKD_QUEUE_MESSAGE_ID
eval "$(raftlockd client queue ack --message-id "$FIRST_ID" --lease "$FIRST_LEASE")"
echo "DELIVERY_KEPT=$([ "${RAFTLOCKD_QUEUE_MESSAGE_ID:-}" = "$SECOND_ID" ] && echo yes)"
eval "$(raftlockd client queue ack)"
echo "CLEARED=${RAFTLOCKD_QUEUE_MESSAGE_ID:-none}"
`)
	v := parseLines(out)
	for name, want := range map[string]string{"LEASE_KEPT": "yes", "DELIVERY_KEPT": "yes", "CLEARED": "none"} {
		if v[name] != want {
			t.Errorf("%s = %q, want %q (output:\n%s)", name, v[name], want, out)
		}
	}
	wantJSON(t, "the shell's key after its own release", v["MINE"], `{"mine":1}`)
}

// TestDeliveryCommandsHelpNamesTheQueueNamespaceVariable: ack, nack and
// extend read the namespace from RAFTLOCKD_QUEUE_NAMESPACE before
// RAFTLOCKD_CLIENT_NAMESPACE, and their help says so.
func TestDeliveryCommandsHelpNamesTheQueueNamespaceVariable(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"ack", "nack", "extend"} {
		help := mustCLI(t, nil, "", "client", "queue", sub, "--help")
		if !strings.Contains(strings.Join(strings.Fields(help), " "), "else RAFTLOCKD_QUEUE_NAMESPACE's (the delivery's, which dequeue exported), else RAFTLOCKD_CLIENT_NAMESPACE's") {
			t.Errorf("client queue %s --help does not name RAFTLOCKD_QUEUE_NAMESPACE first:\n%s", sub, help)
		}
	}
}
