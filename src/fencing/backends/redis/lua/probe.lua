#!lua flags=no-writes
-- What a commit would do now, without writing: the status and the record.
-- KEYS and ARGV[1..7] as in prelude.lua.
return judged(judge())
