package main

import (
	"errors"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// A release, ack or nack answered with a decided transaction's codes
// leaves the transaction over, so its lease's variables are unset; any
// other failure leaves them for a retry.
func TestTxnOverKnowsTheDecidedTransactionsAnswers(t *testing.T) {
	for _, c := range []struct {
		err  error
		over bool
	}{
		{nil, true},
		{errcode.TxnCommitted.With("x"), true},
		{errcode.TxnRolledBack.With("x"), true},
		{errcode.TxnOutcomeMixed.With("island b had rolled it back"), true},
		{errcode.Unavailable.With("x"), false},
		{errors.New("connection refused"), false},
	} {
		if got := txnOver(c.err); got != c.over {
			t.Errorf("txnOver(%v) = %v, want %v", c.err, got, c.over)
		}
	}
}
