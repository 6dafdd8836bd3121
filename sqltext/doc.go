// Package sqltext is the one reading of SQL text in rgproxy: a lexer that
// splits a statement into tokens as MariaDB's and MySQL's own lexer does,
// for every place that reads a client's SQL (mysqlproto's single pass,
// classifier and digest; resourcegroup's admin statements and hints; the
// policy's virtual-table finder).
//
// The server reads a statement in the session's character_set_client and
// sql_mode, so the lexer takes both (Mode):
//
//   - /* ... */ and /*+ ... */ (optimizer hints) are comments; /*! ... */,
//     /*!NNNNN ... */, /*M! ... */ and /*M!NNNNNN ... */ are code whatever
//     the version says (a proxy cannot know which server executes);
//   - "-- " starts a comment only when the second dash is followed by
//     whitespace, a control character or the end of the text; "#" comments
//     run to the end of the line;
//   - '...' and "..." are strings with doubled quotes and, unless
//     NO_BACKSLASH_ESCAPES, backslash escapes; `...` is a quoted
//     identifier with doubled backquotes; with Mode.ANSIQuotes "..." is a
//     quoted identifier too (no session follows ANSI_QUOTES: see Mode);
//   - in a client character set whose multi-byte characters may hold an
//     ASCII byte (gbk, big5, sjis, cp932, MySQL's gb18030: Charset), a lead
//     byte and its trail bytes are one character inside strings, quoted
//     and unquoted identifiers and variable names, exactly as the server's
//     lexer skips them: 0x81 0x5C in gbk is a character, not a backslash,
//     and 0x81 0x60 is not a backquote. Comments are read byte by byte, as
//     the server reads them (no such trail byte is '*', '/' or a newline).
//
// The lexer never allocates and never copies: tokens are spans of the
// input. It is a value: copying it gives a lookahead cursor. For every
// other client character set (utf8mb4, utf8mb3, latin1, binary, ujis,
// euckr, gb2312, ...) the lexer reads byte by byte and the character set
// costs one branch per quoted token or word, not a lookup per byte.
//
// This package imports nothing of the project.
package sqltext
