package httpsink

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

const secretPrefix = "whsec_"

// minSecretBytes is the Standard Webhooks minimum key size (192 bits).
const minSecretBytes = 24

// decodeSecret turns "whsec_<base64>" into the HMAC key. Its errors never
// contain the secret.
func decodeSecret(s string) ([]byte, error) {
	b64, ok := strings.CutPrefix(s, secretPrefix)
	if !ok {
		return nil, errors.New(`must start with "whsec_" followed by the base64 key`)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		// Some secret generators drop the padding.
		key, err = base64.RawStdEncoding.DecodeString(b64)
	}
	if err != nil {
		return nil, errors.New(`the part after "whsec_" is not valid base64`)
	}
	if len(key) < minSecretBytes {
		return nil, errors.New("the key is shorter than the 24 bytes Standard Webhooks requires")
	}
	return key, nil
}

// signer computes Standard Webhooks v1 signatures with one or more keys.
type signer struct {
	keys [][]byte
}

// sign returns the webhook-signature header value: "v1,<base64 HMAC-SHA256
// of id.timestamp.body>" for each key, space-separated. It returns "" when
// there are no keys.
func (s signer) sign(id string, ts int64, body []byte) string {
	if len(s.keys) == 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(len(s.keys) * 48)
	var tsBuf [20]byte
	tsb := strconv.AppendInt(tsBuf[:0], ts, 10)
	var sum [sha256.Size]byte
	for i, k := range s.keys {
		mac := hmac.New(sha256.New, k)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write(tsb)
		mac.Write([]byte{'.'})
		mac.Write(body)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(mac.Sum(sum[:0])))
	}
	return b.String()
}
