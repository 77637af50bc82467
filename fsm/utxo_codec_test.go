package fsm

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

func TestUTXOCodecsRoundTrip(t *testing.T) {
	u := uint32(7)
	recs := []UTXORecord{
		{First: 20000, Count: 20000, Creating: true},
		{Count: 3, Master: &UTXOMaster{Records: 1, Vouts: 3, Total: 2, Spent: 1, Coinbase: true, Locked: true, Height: 9,
			BlockIDs: []uint32{1, 4}, BlockHeights: []uint32{9, 12}, SubtreeIdxs: []int32{-1, 3}, UnminedSince: &u,
			DeleteAtHeight: 300, PreserveUntil: 50, DeletedChildren: []string{tidHex(3)}, CreatedAt: 1_700_000_000_123,
			Inputs: []UTXOPoint{{TxID: tidHex(4), Vout: 2}}, StagedBy: "txn-1"}},
		{Count: 1, Master: &UTXOMaster{Records: 1, BlockIDs: []uint32{}, BlockHeights: []uint32{}, SubtreeIdxs: []int32{}}},
	}
	for i, r := range recs {
		var got UTXORecord
		if err := decodeRecord(encodeRecord(&r), &got); err != nil || !reflect.DeepEqual(got, r) {
			t.Errorf("record %d: %v\n got %+v\nwant %+v", i, err, got.Master, r.Master)
		}
		raw, _ := json.Marshal(r) // the JSON form of earlier versions still reads
		if err := decodeRecord(raw, &got); err != nil || got.Count != r.Count {
			t.Errorf("record %d from JSON: %v", i, err)
		}
	}
	outs := []utxoOutput{
		{Hash: tidHex(1), Sats: 5},
		{Hash: tidHex(1), Sats: 1 << 60, Spent: true, Spender: tidHex(2), Vin: 3, Frozen: true, SpendableAt: 1000,
			Rsv: &utxoReserve{Txn: "t", Spender: tidHex(5), Vin: 1}},
	}
	for i, o := range outs {
		var got utxoOutput
		if err := decodeOut(encodeOut(&o), &got); err != nil || !reflect.DeepEqual(got, o) {
			t.Errorf("output %d: %v: %+v", i, err, got)
		}
	}
	for _, bad := range [][]byte{nil, {2}, {2, 0xFF}, append(encodeOut(&outs[1]), 0), encodeRecord(&recs[1])[:40]} {
		var o utxoOutput
		var r UTXORecord
		if decodeOut(bad, &o) == nil && decodeRecord(bad, &r) == nil {
			t.Errorf("%x decodes", bad)
		}
	}
}

// An undo delta keeps the spender of each outpoint it spent; one written
// before the spenders were kept still decodes, without them.
func TestUndoDeltaDecodesWithAndWithoutSpenders(t *testing.T) {
	p := &blockPlan{created: [][]byte{bytes.Repeat([]byte{1}, 32)}, mined: [][]byte{bytes.Repeat([]byte{2}, 32)},
		spent: [][]byte{bytes.Repeat([]byte{3}, 36)}, spenders: [][]byte{bytes.Repeat([]byte{4}, 36)}}
	b := encodeUndo(p)
	d, ok := decodeUndo(b)
	if !ok || len(d.spenders) != 1 || !bytes.Equal(d.spenders[0], p.spenders[0]) || !bytes.Equal(d.spent[0], p.spent[0]) {
		t.Fatalf("decoded %+v, %v", d, ok)
	}
	if d, ok = decodeUndo(b[:len(b)-36]); !ok || d.spenders != nil || !bytes.Equal(d.spent[0], p.spent[0]) {
		t.Fatalf("decoded an old delta as %+v, %v", d, ok)
	}
	if _, ok = decodeUndo(b[:len(b)-1]); ok {
		t.Fatal("decoded a truncated delta")
	}
}
