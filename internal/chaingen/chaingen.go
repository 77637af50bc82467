// Package chaingen generates chains of blocks over UTXO records for tests
// and benchmarks: deterministic transaction ids and hashes, every
// transaction spending outputs of earlier blocks, so that a run can apply a
// long chain without a real blockchain at hand.
package chaingen

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/raftlockd/raftlockd/wire"
)

// Chain produces consecutive blocks. It is not safe for concurrent use.
type Chain struct {
	seed   string
	height uint32
	prev   string
	serial uint64
	pool   []wire.UTXOBlockInput // unspent outputs, oldest first
}

// New starts a chain whose first block will be at height 1. Chains with
// different seeds share no transaction.
func New(seed string) *Chain {
	return &Chain{seed: seed, prev: Hex(seed, "genesis")}
}

// Hex is a deterministic 64-hex-digit id from parts.
func Hex(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Unspent is how many outputs later blocks can spend.
func (c *Chain) Unspent() int { return len(c.pool) }

// Block returns the next block: txs transactions, each spending ins
// outputs of earlier blocks (none while the chain has too few: a funding
// transaction) and creating outs outputs.
func (c *Chain) Block(txs, ins, outs int) wire.UTXOBlockRequest {
	c.height++
	b := wire.UTXOBlockRequest{Height: c.height, PrevHash: c.prev, Hash: Hex(c.seed, "block", itoa(uint64(c.height)))}
	var created []wire.UTXOBlockInput
	for i := 0; i < txs; i++ {
		c.serial++
		t := wire.UTXOBlockTx{TxID: Hex(c.seed, "tx", itoa(c.serial)), Inputs: []wire.UTXOBlockInput{}}
		if len(c.pool) >= ins {
			t.Inputs, c.pool = append(t.Inputs, c.pool[:ins]...), c.pool[ins:]
		}
		for v := 0; v < outs; v++ {
			h := Hex(t.TxID, "out", itoa(uint64(v)))
			t.Outputs = append(t.Outputs, wire.UTXOOutput{Vout: uint32(v), UTXOHash: h, Satoshis: 1000})
			created = append(created, wire.UTXOBlockInput{TxID: t.TxID, Vout: uint32(v), UTXOHash: h})
		}
		b.Txs = append(b.Txs, t)
	}
	c.pool = append(c.pool, created...)
	c.prev = b.Hash
	return b
}

// Fund returns a block of funding transactions (no inputs) creating n
// outputs in all, outs per transaction.
func (c *Chain) Fund(n, outs int) wire.UTXOBlockRequest {
	saved := c.pool
	c.pool = nil
	b := c.Block((n+outs-1)/outs, 1, outs)
	c.pool = append(saved, c.pool...)
	return b
}

func itoa(v uint64) string { return string(binary.BigEndian.AppendUint64(nil, v)) }
