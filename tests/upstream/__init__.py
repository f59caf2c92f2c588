"""torch's own DCP test cases run against s3ckpt's writer and reader on the test S3 server
(issue 38, item 4): see each module's header for where its cases come from."""
