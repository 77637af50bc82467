package testcluster

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// postJSON sends body to path on node i and returns the status and the
// decoded answer.
func postJSON(t *testing.T, c *Cluster, i int, path string, body any) (int, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.HTTPClient("client").Post(c.URL(i)+path, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s on %s: %v", path, c.Nodes[i].Name, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal(out, &env); err != nil {
		t.Fatalf("%s on %s: %d %q: %v", path, c.Nodes[i].Name, resp.StatusCode, out, err)
	}
	return resp.StatusCode, env
}

// The failed items of a refused UTXO spend or block come back from a
// follower as from the leader, an input or spender's vin of 0 included:
// the item names the input that failed (absent, the transaction itself
// failed) and the spender holding the output.
func TestRefusedUTXOItemsAreTheSameThroughAFollower(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	follower := others(c, leader)[0]

	if status, env := postJSON(t, c, leader, "/v1/utxo/create", testutil.UTXOTx("parent", 1, 546)); status != http.StatusOK {
		t.Fatalf("create: %d %v", status, env)
	}
	spend := func(i int, child string, vin int) (int, map[string]any) {
		return postJSON(t, c, i, "/v1/utxo/spend",
			wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{testutil.UTXOSpend("parent", 0, child, vin)}})
	}
	if status, env := spend(leader, "first", 0); status != http.StatusOK {
		t.Fatalf("spend: %d %v", status, env)
	}
	status, direct := spend(leader, "second", 1)
	if status != http.StatusConflict {
		t.Fatalf("double spend on the leader: %d %v", status, direct)
	}
	items, _ := direct["spends"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["vin"] != float64(0) {
		t.Fatalf("the leader's answer does not name the holder's vin 0: %v", direct)
	}
	status, forwarded := spend(follower, "second", 1)
	if status != http.StatusConflict || !reflect.DeepEqual(forwarded["spends"], direct["spends"]) {
		t.Fatalf("double spend through a follower: %d %v\nthe leader answers %v", status, forwarded, direct)
	}

	// A block whose first transaction's input 0 spends nothing.
	block := chaingen.New("fwd").Block(1, 0, 1)
	block.Txs[0].Inputs = []wire.UTXOBlockInput{{TxID: testutil.Hash32("nowhere"), Vout: 0, UTXOHash: testutil.Hash32("nowhere/0")}}
	status, direct = postJSON(t, c, leader, "/v1/utxo/blocks/apply", block)
	items, _ = direct["spends"].([]any)
	if status != http.StatusConflict || len(items) != 1 || items[0].(map[string]any)["input"] != float64(0) {
		t.Fatalf("a block failing at input 0 on the leader: %d %v", status, direct)
	}
	status, forwarded = postJSON(t, c, follower, "/v1/utxo/blocks/apply", block)
	if status != http.StatusConflict || !reflect.DeepEqual(forwarded["spends"], direct["spends"]) {
		t.Fatalf("a block failing at input 0 through a follower: %d %v\nthe leader answers %v", status, forwarded, direct)
	}
}
