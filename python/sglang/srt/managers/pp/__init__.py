"""The pipeline-parallel ring (`--pp-size > 1`): see README.md in this folder.

Import from the modules (`managers.pp.rank`, `.driver`, `.stage`, `.messages`, `.trace`); this
package file imports nothing, so importing one part never pulls in the others.
"""
