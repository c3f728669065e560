// Package redacttest builds inputs with a password in every place a
// password goes, for the fuzz tests that check that no output shows it
// (redact.FuzzURL, and the CLI's FuzzSecretsNotPrinted over every error
// and log text a URL reaches).
package redacttest

// The two passwords a fuzz test compares: the text shown for an input must
// be the same with either. Both are letters and digits of the same length
// starting with a letter that is not a hex digit, so no parser can tell
// them apart by their shape (neither completes a percent escape, neither is
// a number, a boolean or a duration).
const (
	PasswordA = "S3cr3tPW"
	PasswordB = "Zq9Zq9Zq"
)

// Keys are the parameter names Input uses; Form picks one (or userinfo).
var Keys = []string{"password", "PASSWORD", "Password", "sslpassword", "secret", "token", "access_token", "api_key"}

// Input is a fuzzed string around a password: Pre+User+":"+password+"@"+Post
// when Form selects userinfo, else Pre+User+key+"="+password+Post.
type Input struct {
	Form            uint8
	Pre, User, Post string
}

// Build returns the input with password pw.
func (in Input) Build(pw string) string {
	n := int(in.Form) % (len(Keys) + 1)
	if n == 0 {
		return in.Pre + in.User + ":" + pw + "@" + in.Post
	}
	return in.Pre + in.User + Keys[n-1] + "=" + pw + in.Post
}

// Seeds are the malformed and well-formed shapes found so far: missing
// colon or slashes, no scheme, invalid ports and escapes, fragments, a path
// holding userinfo, upper-case and nested parameters, key/value strings.
var Seeds = []Input{
	{0, "postgres://", "u", "h/db"},
	{0, "postgres//", "u", "h/db"},
	{0, "postgres:/", "u", "h/db"},
	{0, "postgres:", "u", "h/db"},
	{0, "", "u", "h/db"},
	{0, "postgres://", "u", "h:99999/db"},
	{0, "postgres://", "u", "h/db#frag"},
	{0, "postgres://", "u", "%zz@h/db"},
	{0, "https//", "u", "h/x"},
	{0, "kafka://", "u", "h:1,h2:2"},
	{0, "kafka//", "u", "h:1"},
	{0, "kafka://h:1/", "u", "x"},
	{0, "amqp://", "guest", "127.0.0.1:5672/?exchange=x"},
	{0, "https://", "u", "h.example.com/hook"},
	{0, "host=h port=5432 ", "u", "h"},
	{1, "postgres://u@h/db?", "", ""},
	{2, "postgres://u@h/db?sslmode=disable&", "", "&x=1"},
	{3, "host=h port=5432 ", "", " dbname=db"},
	{4, "postgres://u@h/db?", "", "#x"},
	{5, "https://h.example.com/x?", "", ""},
	{6, "kafka://h:1?tls=", "", ""},
	{7, "https://h.example.com/x?timeout=", "", ""},
	{8, "host=h ", "", "\\ x"},
	{2, "postgres://u@h/db?a=", "", ""},
	{1, "host=h password='", "", " x'"},
	{3, "amqp://h/?exchange=x&heartbeat=", "", ""},
	{1, "postgres//u@h/db?", "", ""},
}
