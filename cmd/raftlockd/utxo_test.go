package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/wire"
)

// TestCLIUTXO drives `client utxo` against a real node the way an operator
// would: requests from stdin and from --file, answers as JSON on stdout,
// rejections on stderr with a non-zero exit.
func TestCLIUTXO(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	env := srv.clientEnv()
	hex := func(c string) string { return strings.Repeat(c, 64) }
	txid, hash0, hash1, newHash := hex("a"), hex("b"), hex("c"), hex("9")
	child, rival, unknown := hex("d"), hex("e"), hex("f")

	utxo := func(out any, stdin string, args ...string) {
		t.Helper()
		raw := mustCLI(t, env, stdin, append([]string{"client", "utxo"}, args...)...)
		if err := json.Unmarshal([]byte(raw), out); err != nil {
			t.Fatalf("utxo %s: %v in %q", strings.Join(args, " "), err, raw)
		}
	}
	get := func(args ...string) wire.UTXOTx {
		t.Helper()
		var tx wire.UTXOTx
		utxo(&tx, "", append([]string{"get", "--txid", txid}, args...)...)
		return tx
	}
	refused := func(stdin string, args ...string) string {
		t.Helper()
		res := cli(t, env, stdin, append([]string{"client", "utxo"}, args...)...)
		if res.code == 0 || res.stdout != "" {
			t.Fatalf("utxo %s: exit %d, stdout %q; want a refusal", strings.Join(args, " "), res.code, res.stdout)
		}
		return res.stderr
	}
	outpoint := `{"outpoints":[{"txid":"` + txid + `","vout":1,"utxo_hash":"` + hash1 + `"}]}`

	var created wire.UTXOCreateResponse
	utxo(&created, `{"txid":"`+txid+`","outputs":[{"vout":0,"utxo_hash":"`+hash0+`","satoshis":1000},`+
		`{"vout":1,"utxo_hash":"`+hash1+`","satoshis":2500}]}`, "create")
	if created.TxID != txid || created.Records != 1 {
		t.Fatalf("create answered %+v", created)
	}
	tx := get()
	if tx.TxID != txid || len(tx.Outputs) != 2 || tx.TotalOutputs != 2 || tx.SpentOutputs != 0 || tx.Creating ||
		tx.Outputs[0].UTXOHash != hash0 || tx.Outputs[0].Satoshis != 1000 || tx.Outputs[0].SpendingTxID != "" ||
		tx.Outputs[1].UTXOHash != hash1 || tx.Outputs[1].Satoshis != 2500 {
		t.Fatalf("created transaction reads as %+v", tx)
	}

	// Spend output 0, with the request in a file.
	spendFile := filepath.Join(t.TempDir(), "spend.json")
	if err := os.WriteFile(spendFile, []byte(`{"spends":[{"txid":"`+txid+`","vout":0,"utxo_hash":"`+hash0+
		`","spending_txid":"`+child+`","vin":2}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var spent wire.UTXOSpendResponse
	utxo(&spent, "", "spend", "--file", spendFile)
	if spent.Spent != 1 {
		t.Fatalf("spend answered %+v", spent)
	}
	// The file may be named as the argument too (the same spend again is a
	// success); not both ways at once.
	utxo(&spent, "", "spend", spendFile)
	if spent.Spent != 1 {
		t.Fatalf("spend with the file as its argument answered %+v", spent)
	}
	if msg := refused("", "spend", spendFile, "--file", "other.json"); !strings.Contains(msg, "not both") {
		t.Fatalf("spend naming two files: %q", msg)
	}
	// RAFTLOCKD_CLIENT_FILE is not the command line: the argument wins, as
	// a flag does over its variable.
	if err := json.Unmarshal([]byte(mustCLI(t, append(slices.Clone(env), clientEnv+"FILE="+filepath.Join(t.TempDir(), "other.json")), "",
		"client", "utxo", "spend", spendFile)), &spent); err != nil || spent.Spent != 1 {
		t.Fatalf("spend with the file as its argument and RAFTLOCKD_CLIENT_FILE set: %+v, %v", spent, err)
	}
	tx = get("--stale")
	out := tx.Outputs[0]
	if out.SpendingTxID != child || out.Vin == nil || *out.Vin != 2 || out.SpendingData != child+"02000000" || tx.SpentOutputs != 1 {
		t.Fatalf("spent output reads as %+v (spent outputs %d)", out, tx.SpentOutputs)
	}

	// Another child cannot spend it: nothing changes and the failed item
	// names the spender.
	msg := refused(`{"spends":[{"txid":"`+txid+`","vout":0,"utxo_hash":"`+hash0+`","spending_txid":"`+rival+`","vin":0}]}`, "spend")
	for _, want := range []string{"utxo_spend_failed", "spends[0]: " + wire.UTXOSpent + " by " + child + " vin 2"} {
		if !strings.Contains(msg, want) {
			t.Errorf("double spend: stderr %q lacks %q", msg, want)
		}
	}
	if got := get().Outputs[0]; got.SpendingTxID != child {
		t.Fatalf("a refused spend changed the output: %+v", got)
	}

	var updated wire.UTXOUpdateResponse
	utxo(&updated, `{"block_height":500}`, "height")
	if updated.BlockHeight == nil || *updated.BlockHeight != 500 {
		t.Fatalf("height answered %+v", updated)
	}

	// Freeze, refuse a second freeze, unfreeze, freeze and reassign.
	utxo(&updated, outpoint, "freeze")
	if updated.Updated != 1 || !get().Outputs[1].Frozen {
		t.Fatalf("freeze answered %+v", updated)
	}
	if msg := refused(outpoint, "freeze"); !strings.Contains(msg, "outpoints[0]: "+wire.UTXOAlreadyFrozen) {
		t.Errorf("second freeze: %q", msg)
	}
	utxo(&updated, outpoint, "unfreeze")
	if updated.Updated != 1 || get().Outputs[1].Frozen {
		t.Fatalf("unfreeze answered %+v", updated)
	}
	utxo(&updated, outpoint, "freeze")
	utxo(&updated, `{"txid":"`+txid+`","vout":1,"utxo_hash":"`+hash1+`","new_utxo_hash":"`+newHash+`"}`, "reassign")
	if updated.Updated != 1 {
		t.Fatalf("reassign answered %+v", updated)
	}
	tx = get()
	if out := tx.Outputs[1]; out.UTXOHash != newHash || out.Frozen || out.SpendableAtHeight != 500+wire.UTXOReassignMaturity ||
		tx.ChainHeight != 500 {
		t.Fatalf("reassigned output reads as %+v at height %d", out, tx.ChainHeight)
	}

	utxo(&updated, `{"txids":["`+txid+`","`+unknown+`"],"block_id":7,"block_height":499,"subtree_idx":3,"on_longest_chain":true}`, "mined")
	if updated.Updated != 1 || !slices.Equal(updated.NotFound, []string{unknown}) {
		t.Fatalf("mined answered %+v", updated)
	}
	tx = get()
	if !slices.Equal(tx.BlockIDs, []uint32{7}) || !slices.Equal(tx.BlockHeights, []uint32{499}) ||
		!slices.Equal(tx.SubtreeIdxs, []int32{3}) || tx.UnminedSince != nil {
		t.Fatalf("mined transaction reads as %+v", tx)
	}

	// What the command or the server refuses.
	if msg := refused("", "get", "--txid", unknown); !strings.Contains(msg, "tx_not_found") {
		t.Errorf("get of an unknown transaction: %q", msg)
	}
	if msg := refused(`{"txid":"`+txid+`","outputs":[],"extra":1}`, "create"); !strings.Contains(msg, `unknown field "extra"`) {
		t.Errorf("create with an unknown field: %q", msg)
	}
	if msg := refused("", "height"); !strings.Contains(msg, "no request on stdin") {
		t.Errorf("height without a request: %q", msg)
	}
	// A field the API requires is required here too: sent again from the
	// decoded request, it would arrive as its zero value.
	for _, c := range []struct{ body, cmd, field string }{
		{`{}`, "height", "block_height"},
		{`{"block_height":null}`, "height", "block_height"},
		{`{"txids":["` + txid + `"]}`, "preserve", "until_height"},
		{`{"txids":["` + txid + `"]}`, "conflicting", "value"},
		{`{"txids":["` + txid + `"],"block_id":7}`, "mined", "block_height"},
	} {
		if msg := refused(c.body, c.cmd); !strings.Contains(msg, "needs "+c.field) {
			t.Errorf("%s %s: %q", c.cmd, c.body, msg)
		}
	}
	var st wire.UTXOStatus
	utxo(&st, "", "status")
	if st.ChainHeight != 500 {
		t.Fatalf("the chain height is %d after refused requests, want 500", st.ChainHeight)
	}
}
