package sqlscript

// Statements and Uses expose what the lexer found, for TestParse: the
// statements of a script and the parameters it uses.
func Statements(q *Script) []string {
	stmts, _, _ := lexSQL(q.script)
	return stmts
}

func Uses(q *Script) []string {
	_, uses, _ := lexSQL(q.script)
	return uses
}
