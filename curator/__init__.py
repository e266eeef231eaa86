"""The curator role: a thin I/O shell over mechanism/ and infra/.

cli (flags) -> config (one typed CuratorConfig) -> runner (the steps: agree, prepare, upload,
serve keys) over agreement (leader/follower), leader (tag collection), service (RPCs), upload
(client of the release server), keystore and table (files).
"""
