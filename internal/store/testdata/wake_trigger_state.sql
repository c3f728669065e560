SELECT t.tgenabled <> 'D' FROM pg_trigger t
WHERE t.tgrelid = to_regclass(@table) AND t.tgname = 'messages_notify'
