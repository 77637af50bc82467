package fsm

import (
	"encoding/binary"
	"testing"
)

// benchChain builds blocks of n two-input, two-output transactions, each
// spending the outputs of one transaction of the previous block.
type benchChain struct {
	serial uint64
	prev   [][32]byte // transactions of the previous block
}

func (c *benchChain) id() [32]byte {
	c.serial++
	var t [32]byte
	binary.BigEndian.PutUint64(t[:8], c.serial*0x9E3779B97F4A7C15) // spread over the key space
	binary.BigEndian.PutUint64(t[24:], c.serial)
	return t
}

func (c *benchChain) block(n int) []BlockTx {
	txs := make([]BlockTx, n)
	next := make([][32]byte, n)
	for i := range txs {
		t := BlockTx{TxID: c.id()}
		if len(c.prev) == n {
			p := c.prev[i]
			t.Inputs = []BlockIn{{TxID: p, Vout: 0, Hash: p}, {TxID: p, Vout: 1, Hash: p}}
		}
		t.Outputs = []UTXOOut{{Vout: 0, Hash: t.TxID, Sats: 1}, {Vout: 1, Hash: t.TxID, Sats: 1}}
		txs[i], next[i] = t, t.TxID
	}
	c.prev = next
	return txs
}

// BenchmarkBlockApply applies blocks of 1,000 two-input, two-output
// transactions to the state machine alone (no Raft, no HTTP): spends/s is
// the state machine's ceiling for block apply.
func BenchmarkBlockApply(b *testing.B) {
	h := openHarness(b, b.TempDir())
	c := &benchChain{}
	const n = 1000
	h.ok(blockCmd(1, c.block(n)...))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.ok(blockCmd(uint32(i+2), c.block(n)...))
	}
	b.ReportMetric(float64(2*n*b.N)/b.Elapsed().Seconds(), "spends/s")
}
