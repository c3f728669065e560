SELECT current_setting('wal_level') = 'logical', EXISTS (SELECT 1 FROM pg_publication WHERE pubname = @publication),
       EXISTS (SELECT 1 FROM pg_publication p JOIN pg_publication_tables t USING (pubname)
               WHERE p.pubname = @publication AND p.pubinsert AND t.schemaname = @schema AND t.tablename = 'messages'),
       current_setting('server_version_num')::int
