"""The dashboard's pages: runs table (/), compare (/compare), one run (/runs/<id>), and the shared chart callback."""
