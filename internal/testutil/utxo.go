package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/raftlockd/raftlockd/wire"
)

// Hash32 is the SHA-256 of s in hex: a transaction id or output hash that
// tests can name.
func Hash32(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// UTXOTx is a create request for the transaction named name with n
// outputs: output i has the hash Hash32("name/i") and sats satoshis.
func UTXOTx(name string, n int, sats uint64) wire.UTXOCreateRequest {
	req := wire.UTXOCreateRequest{TxID: Hash32(name)}
	for i := 0; i < n; i++ {
		req.Outputs = append(req.Outputs, wire.UTXOOutput{Vout: uint32(i), UTXOHash: Hash32(fmt.Sprintf("%s/%d", name, i)), Satoshis: sats})
	}
	return req
}

// UTXOSpend spends output vout of the transaction UTXOTx named name for
// input vin of the transaction named child.
func UTXOSpend(name string, vout int, child string, vin int) wire.UTXOSpend {
	return wire.UTXOSpend{TxID: Hash32(name), Vout: uint32(vout), UTXOHash: Hash32(fmt.Sprintf("%s/%d", name, vout)),
		SpendingTxID: Hash32(child), Vin: uint32(vin)}
}
