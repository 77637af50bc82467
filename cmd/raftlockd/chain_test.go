package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/wire"
)

// TestCLIBlocks applies blocks, reads the status, prunes and rolls back
// with `client utxo block|status|prune`, against a real node.
func TestCLIBlocks(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	env := srv.clientEnv()
	hex := func(c string) string { return strings.Repeat(c, 64) }
	run := func(out any, stdin string, args ...string) {
		t.Helper()
		raw := mustCLI(t, env, stdin, append([]string{"client", "utxo"}, args...)...)
		if err := json.Unmarshal([]byte(raw), out); err != nil {
			t.Fatalf("utxo %s: %v in %q", strings.Join(args, " "), err, raw)
		}
	}
	block1 := `{"height":1,"hash":"` + hex("1") + `","prev_hash":"` + hex("0") + `","txs":[{"txid":"` + hex("a") +
		`","inputs":[],"outputs":[{"vout":0,"utxo_hash":"` + hex("b") + `","satoshis":50}]}]}`
	var applied wire.UTXOBlockResponse
	run(&applied, block1, "block", "apply")
	if applied.ChainHeight != 1 || applied.Block.Created != 1 || applied.AlreadyApplied {
		t.Fatalf("apply answered %+v", applied)
	}
	// A block spending an output that does not exist is refused whole,
	// naming the transaction and input.
	bad := `{"height":2,"hash":"` + hex("2") + `","prev_hash":"` + hex("1") + `","txs":[{"txid":"` + hex("c") +
		`","inputs":[{"txid":"` + hex("a") + `","vout":7,"utxo_hash":"` + hex("b") + `"}],"outputs":[{"vout":0,"utxo_hash":"` + hex("d") + `","satoshis":40}]}]}`
	res := cli(t, env, bad, "client", "utxo", "block", "apply")
	if res.code == 0 || !strings.Contains(res.stderr, "block_rejected") || !strings.Contains(res.stderr, "input 0: UTXO_NOT_FOUND") {
		t.Fatalf("bad block: exit %d, stderr %q", res.code, res.stderr)
	}
	block2 := strings.Replace(bad, `"vout":7`, `"vout":0`, 1)
	run(&applied, block2, "block", "apply")
	var st wire.UTXOStatus
	run(&st, "", "status")
	if st.ChainHeight != 2 || st.LastBlock == nil || st.LastBlock.Hash != hex("2") || st.Transactions != 2 || st.BlocksApplied != 2 {
		t.Fatalf("status %+v", st)
	}
	var pruned wire.UTXOPruneResponse
	run(&pruned, "", "prune")
	if pruned.ChainHeight != 2 || !pruned.Wrapped || len(pruned.Pruned) != 0 {
		t.Fatalf("prune answered %+v", pruned)
	}
	var undone wire.UTXORollbackResponse
	run(&undone, "", "block", "rollback", "--to-height", "1")
	if undone.ChainHeight != 1 || len(undone.Undone) != 1 || undone.Undone[0].Hash != hex("2") {
		t.Fatalf("rollback answered %+v", undone)
	}
	if res := cli(t, env, "", "client", "utxo", "block", "rollback"); res.code == 0 || !strings.Contains(res.stderr, "--to-height") {
		t.Fatalf("rollback without a height: %+v", res)
	}
}
