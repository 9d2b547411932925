"""(rules registered here)"""
