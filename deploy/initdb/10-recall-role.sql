-- Runs once, as the image's superuser, when the data volume is first created.
-- Recall connects as `recall`: the owner of its tables, but not a superuser,
-- so FORCE ROW LEVEL SECURITY applies to it. CREATEROLE lets the migrations
-- create the recall_app, recall_agent and recall_operator roles.
CREATE ROLE recall LOGIN PASSWORD 'change-me-recall' CREATEROLE;
ALTER DATABASE recall OWNER TO recall;
\connect recall
ALTER SCHEMA public OWNER TO recall;
CREATE EXTENSION IF NOT EXISTS vector;
