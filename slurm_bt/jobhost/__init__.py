"""jobhost"""
