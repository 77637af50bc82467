package api

// Exported for the tests of package api_test.

// RecordingUTXOs is the fake UTXO service that records every call.
type RecordingUTXOs = recordingUTXOs

// UTXORead is what RecordingUTXOs records for a Get.
type UTXORead = utxoRead

// NewRecordingUTXOs returns a RecordingUTXOs that has seen no calls and
// answers every call with a success.
func NewRecordingUTXOs() *RecordingUTXOs { return &recordingUTXOs{} }
