package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
)

// statusOf is the one place where error codes become HTTP statuses.
var statusOf = map[string]int{
	errcode.InvalidBody.Code:          http.StatusBadRequest,
	errcode.MissingBody.Code:          http.StatusBadRequest,
	errcode.MissingKey.Code:           http.StatusBadRequest,
	errcode.InvalidKey.Code:           http.StatusBadRequest,
	errcode.InvalidNamespace.Code:     http.StatusBadRequest,
	errcode.MissingOwner.Code:         http.StatusBadRequest,
	errcode.InvalidTTL.Code:           http.StatusBadRequest,
	errcode.InvalidBlock.Code:         http.StatusBadRequest,
	errcode.MissingLease.Code:         http.StatusBadRequest,
	errcode.InvalidLease.Code:         http.StatusBadRequest,
	errcode.MissingTxn.Code:           http.StatusBadRequest,
	errcode.InvalidTxn.Code:           http.StatusBadRequest,
	errcode.InvalidVersion.Code:       http.StatusBadRequest,
	errcode.MissingFencing.Code:       http.StatusBadRequest,
	errcode.InvalidFencing.Code:       http.StatusBadRequest,
	errcode.InvalidIdempotency.Code:   http.StatusBadRequest,
	errcode.InvalidParams.Code:        http.StatusBadRequest,
	errcode.InvalidChecksum.Code:      http.StatusBadRequest,
	errcode.InvalidSize.Code:          http.StatusBadRequest,
	errcode.InvalidTimeout.Code:       http.StatusBadRequest,
	errcode.MalformedCmd.Code:         http.StatusBadRequest,
	errcode.UnknownCmd.Code:           http.StatusBadRequest,
	errcode.InvalidSnapshot.Code:      http.StatusBadRequest,
	errcode.InvalidEndpoint.Code:      http.StatusBadRequest,
	errcode.InvalidQueue.Code:         http.StatusBadRequest,
	errcode.InvalidCertificate.Code:   http.StatusBadRequest,
	errcode.InvalidTxID.Code:          http.StatusBadRequest,
	errcode.InvalidUTXOHash.Code:      http.StatusBadRequest,
	errcode.DuplicateVout.Code:        http.StatusBadRequest,
	errcode.InvalidUTXORequest.Code:   http.StatusBadRequest,
	errcode.TxExists.Code:             http.StatusConflict,
	errcode.TxNotFound.Code:           http.StatusNotFound,
	errcode.UTXOSpendFailed.Code:      http.StatusConflict,
	errcode.UTXOUpdateFailed.Code:     http.StatusConflict,
	errcode.InvalidUTXOBlock.Code:     http.StatusBadRequest,
	errcode.BlockNotOnTip.Code:        http.StatusConflict,
	errcode.BlockRejected.Code:        http.StatusConflict,
	errcode.BlockRollbackWindow.Code:  http.StatusConflict,
	errcode.TLSRequired.Code:          http.StatusBadRequest,
	errcode.CertificateRequired.Code:  http.StatusUnauthorized,
	errcode.CertificateUntrusted.Code: http.StatusUnauthorized,
	errcode.CertificateExpired.Code:   http.StatusUnauthorized,
	errcode.CertificateRevoked.Code:   http.StatusUnauthorized,
	errcode.RoleForbidden.Code:        http.StatusForbidden,
	errcode.NamespaceForbidden.Code:   http.StatusForbidden,
	errcode.LeaseRequired.Code:        http.StatusForbidden,
	errcode.LeaseExpired.Code:         http.StatusForbidden,
	errcode.FencingMismatch.Code:      http.StatusForbidden,
	errcode.NotFound.Code:             http.StatusNotFound,
	errcode.QueueMessageNotFound.Code: http.StatusNotFound,
	errcode.MethodNotAllowed.Code:     http.StatusMethodNotAllowed,
	errcode.Waiting.Code:              http.StatusConflict,
	errcode.AlreadyExists.Code:        http.StatusConflict,
	errcode.VersionConflict.Code:      http.StatusConflict,
	errcode.ETagMismatch.Code:         http.StatusConflict,
	errcode.TxnMismatch.Code:          http.StatusConflict,
	errcode.TxnCommitted.Code:         http.StatusConflict,
	errcode.TxnRolledBack.Code:        http.StatusConflict,
	errcode.TxnTooLarge.Code:          http.StatusConflict,
	errcode.LeaseMismatch.Code:        http.StatusConflict,
	errcode.ChecksumMismatch.Code:     http.StatusConflict,
	errcode.SizeMismatch.Code:         http.StatusConflict,
	errcode.LastVoter.Code:            http.StatusConflict,
	errcode.TxnPending.Code:           http.StatusConflict,
	errcode.TxnBackendMismatch.Code:   http.StatusConflict,
	errcode.TxnBackendUnknown.Code:    http.StatusConflict,
	errcode.TCTermStale.Code:          http.StatusConflict,
	errcode.TxnLockConflict.Code:      http.StatusConflict,
	errcode.TxnNotHome.Code:           http.StatusConflict,
	errcode.TxnCoordinated.Code:       http.StatusConflict,
	errcode.TxnOutcomeMixed.Code:      http.StatusConflict,
	errcode.QueueEmpty.Code:           http.StatusConflict,
	errcode.QueueLeaseMismatch.Code:   http.StatusConflict,
	errcode.TxnFanoutFailed.Code:      http.StatusBadGateway,
	errcode.TCRMReplication.Code:      http.StatusBadGateway,
	errcode.TxnUnreachable.Code:       http.StatusServiceUnavailable,
	errcode.RequestTooLarge.Code:      http.StatusRequestEntityTooLarge,
	errcode.StateTooLarge.Code:        http.StatusRequestEntityTooLarge,
	errcode.PayloadTooLarge.Code:      http.StatusRequestEntityTooLarge,
	errcode.NoLeader.Code:             http.StatusServiceUnavailable,
	errcode.NotLeader.Code:            http.StatusServiceUnavailable,
	errcode.Unavailable.Code:          http.StatusServiceUnavailable,
	errcode.ShuttingDown.Code:         http.StatusServiceUnavailable,
	errcode.NotReady.Code:             http.StatusServiceUnavailable,
	errcode.RequestCancel.Code:        499,
	errcode.Internal.Code:             http.StatusInternalServerError,
}

// StatusOf returns the HTTP status for an error code (500 when unknown).
func StatusOf(code string) int {
	if s, ok := statusOf[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// asError turns any error into an envelope. A request cut short by the
// server (shutdown) reports the server's reason. Errors without a code are
// internal: they are logged and reported without their text.
func asError(ctx context.Context, err error, log *slog.Logger) *errcode.Error {
	var e *errcode.Error
	var cause *errcode.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, auth.ErrNoCertificate):
		return errcode.CertificateRequired.With("this endpoint needs a client certificate")
	case errors.Is(err, auth.ErrExpired):
		return errcode.CertificateExpired.With("%v", err)
	case errors.Is(err, auth.ErrUnknownCA), errors.Is(err, auth.ErrWrongRole):
		return errcode.CertificateUntrusted.With("%v", err)
	case errors.Is(err, auth.ErrRevoked):
		return errcode.CertificateRevoked.With("%v", err)
	case ctx.Err() != nil && errors.As(context.Cause(ctx), &cause):
		return cause
	case errors.Is(err, context.Canceled):
		return errcode.RequestCancel.With("request cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		e := errcode.Unavailable.With("request deadline exceeded")
		e.RetryAfter = 1
		return e
	}
	log.Error("internal error", "error", err)
	return errcode.Internal.With("internal error")
}

func writeError(ctx context.Context, w http.ResponseWriter, err error, log *slog.Logger) {
	e := asError(ctx, err, log)
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(e.RetryAfter, 10))
	}
	writeJSON(w, StatusOf(e.Code), e)
}

// WriteRawError writes e as a complete HTTP/1.1 response that closes the
// connection, for a connection no http.Server serves (a plain-HTTP request
// on the TLS port).
func WriteRawError(w io.Writer, e *errcode.Error) error {
	body, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("api: encode error: %w", err)
	}
	status := StatusOf(e.Code)
	_, err = fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		status, http.StatusText(status), len(body)+1, body)
	return err
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
